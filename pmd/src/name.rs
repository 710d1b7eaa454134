//! Device names: how an application says which NIC it wants.
//!
//! | name | device |
//! | --- | --- |
//! | `soft:<netdev>` | softnic on `<netdev>`, GID 0 from the netdev's first address |
//! | `soft:<netdev>@<addr>` | softnic on `<netdev>` bound to `<addr>` (IPv4 or IPv6) |
//! | `fabric:<name>/<port>` | softnic on port `<port>` of the in-process fabric `<name>` |
//! | `mlx5:<ibdev>` | a ConnectX through rdma-sys and mlx5dv (cargo feature `mlx5`) |
//!
//! Parsing is strict: an empty netdev, a bad address or a port that is not a number is an error
//! that says which part was wrong, so a typo on a command line never opens another device.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// A parsed device name. `Display` writes it back in the same form.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceName {
    /// `soft:<netdev>` or `soft:<netdev>@<addr>`: softnic over UDP on a Linux netdev.
    Soft {
        /// The netdev the device's socket is bound to (`SO_BINDTODEVICE`).
        netdev: String,
        /// The address to bind; `None` means the netdev's first address.
        addr: Option<IpAddr>,
    },
    /// `fabric:<name>/<port>`: softnic on a port of an in-process simulated fabric.
    Fabric {
        /// The name the fabric was registered under (see `provider::soft::register_fabric`).
        fabric: String,
        /// The port number on that fabric.
        port: u32,
    },
    /// `mlx5:<ibdev>`: a ConnectX, by its verbs device name (`mlx5_0`, ...).
    Mlx5 {
        /// The verbs device name as `ibv_get_device_name` reports it.
        ibdev: String,
    },
}

/// Why a device name did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// The part before the first `:` is not a provider we know.
    #[error("device name {name:?}: unknown provider {provider:?} (expected soft, fabric or mlx5)")]
    UnknownProvider {
        /// The whole name as given.
        name: String,
        /// The provider part.
        provider: String,
    },
    /// There is no `:` at all.
    #[error("device name {name:?} has no provider prefix (expected soft:, fabric: or mlx5:)")]
    MissingProvider {
        /// The whole name as given.
        name: String,
    },
    /// A required part is empty or malformed.
    #[error("device name {name:?}: {part} {problem}")]
    BadPart {
        /// The whole name as given.
        name: String,
        /// Which part (netdev, address, fabric, port, ibdev).
        part: &'static str,
        /// What is wrong with it.
        problem: String,
    },
}

impl DeviceName {
    /// The provider prefix of this name (`soft`, `fabric` or `mlx5`).
    pub fn provider(&self) -> &'static str {
        match self {
            DeviceName::Soft { .. } => "soft",
            DeviceName::Fabric { .. } => "fabric",
            DeviceName::Mlx5 { .. } => "mlx5",
        }
    }
}

fn bad(name: &str, part: &'static str, problem: impl Into<String>) -> NameError {
    NameError::BadPart {
        name: name.to_string(),
        part,
        problem: problem.into(),
    }
}

/// Netdev names follow the kernel's rules: 1..=15 bytes, no `/`, `:` or whitespace.
fn check_ifname(name: &str, netdev: &str) -> Result<(), NameError> {
    if netdev.is_empty() {
        return Err(bad(name, "netdev", "is empty"));
    }
    if netdev.len() > 15 {
        return Err(bad(name, "netdev", "is longer than 15 bytes"));
    }
    if netdev
        .chars()
        .any(|c| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(bad(name, "netdev", "contains '/', ':' or whitespace"));
    }
    Ok(())
}

impl FromStr for DeviceName {
    type Err = NameError;

    fn from_str(name: &str) -> Result<Self, NameError> {
        let Some((provider, rest)) = name.split_once(':') else {
            return Err(NameError::MissingProvider {
                name: name.to_string(),
            });
        };
        match provider {
            "soft" => {
                let (netdev, addr) = match rest.split_once('@') {
                    Some((netdev, addr)) => {
                        // Accept `[v6]` as well as a bare v6 address.
                        let bare = addr
                            .strip_prefix('[')
                            .and_then(|a| a.strip_suffix(']'))
                            .unwrap_or(addr);
                        let ip = bare.parse::<IpAddr>().map_err(|e| {
                            bad(
                                name,
                                "address",
                                format!("{addr:?} is not an IP address: {e}"),
                            )
                        })?;
                        (netdev, Some(ip))
                    }
                    None => (rest, None),
                };
                check_ifname(name, netdev)?;
                Ok(DeviceName::Soft {
                    netdev: netdev.to_string(),
                    addr,
                })
            }
            "fabric" => {
                let Some((fabric, port)) = rest.rsplit_once('/') else {
                    return Err(bad(
                        name,
                        "port",
                        "is missing (expected fabric:<name>/<port>)",
                    ));
                };
                if fabric.is_empty() {
                    return Err(bad(name, "fabric", "is empty"));
                }
                let port = port
                    .parse::<u32>()
                    .map_err(|e| bad(name, "port", format!("{port:?} is not a number: {e}")))?;
                Ok(DeviceName::Fabric {
                    fabric: fabric.to_string(),
                    port,
                })
            }
            "mlx5" => {
                if rest.is_empty() {
                    return Err(bad(name, "ibdev", "is empty"));
                }
                Ok(DeviceName::Mlx5 {
                    ibdev: rest.to_string(),
                })
            }
            other => Err(NameError::UnknownProvider {
                name: name.to_string(),
                provider: other.to_string(),
            }),
        }
    }
}

impl fmt::Display for DeviceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceName::Soft { netdev, addr: None } => write!(f, "soft:{netdev}"),
            DeviceName::Soft {
                netdev,
                addr: Some(IpAddr::V6(a)),
            } => write!(f, "soft:{netdev}@[{a}]"),
            DeviceName::Soft {
                netdev,
                addr: Some(a),
            } => write!(f, "soft:{netdev}@{a}"),
            DeviceName::Fabric { fabric, port } => write!(f, "fabric:{fabric}/{port}"),
            DeviceName::Mlx5 { ibdev } => write!(f, "mlx5:{ibdev}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<DeviceName, NameError> {
        s.parse()
    }

    #[test]
    fn soft_netdev_without_address_parses() {
        assert_eq!(
            parse("soft:veth0").unwrap(),
            DeviceName::Soft {
                netdev: "veth0".into(),
                addr: None
            }
        );
    }

    #[test]
    fn soft_netdev_with_ipv4_and_ipv6_addresses_parse_and_print_back() {
        for s in [
            "soft:lo@127.0.0.2",
            "soft:eth1@[fd00::1]",
            "soft:eth1@198.18.0.1",
        ] {
            let name = parse(s).unwrap();
            assert_eq!(name.to_string(), s);
        }
        assert_eq!(
            parse("soft:eth1@fd00::1").unwrap().to_string(),
            "soft:eth1@[fd00::1]"
        );
    }

    #[test]
    fn fabric_name_and_port_parse() {
        assert_eq!(
            parse("fabric:sim/3").unwrap(),
            DeviceName::Fabric {
                fabric: "sim".into(),
                port: 3
            }
        );
        assert_eq!(parse("fabric:a/b/7").unwrap().to_string(), "fabric:a/b/7");
    }

    #[test]
    fn mlx5_name_parses() {
        assert_eq!(
            parse("mlx5:mlx5_0").unwrap(),
            DeviceName::Mlx5 {
                ibdev: "mlx5_0".into()
            }
        );
    }

    #[test]
    fn malformed_names_say_which_part_is_wrong() {
        let cases = [
            ("veth0", "no provider prefix"),
            ("rxe:veth0", "unknown provider \"rxe\""),
            ("soft:", "netdev is empty"),
            ("soft:abcdefghijklmnop", "netdev is longer than 15 bytes"),
            (
                "soft:lo@300.1.1.1",
                "address \"300.1.1.1\" is not an IP address",
            ),
            ("fabric:sim", "port is missing"),
            ("fabric:/1", "fabric is empty"),
            ("fabric:sim/x", "port \"x\" is not a number"),
            ("mlx5:", "ibdev is empty"),
        ];
        for (input, expected) in cases {
            let err = parse(input).unwrap_err().to_string();
            assert!(err.contains(expected), "{input}: {err}");
        }
    }
}
