//! Per-device lists of shared objects (the control channels' shared CQs, the backup QPs'
//! shared CQs), held weakly: an object goes with its last user, and a device's entry with its
//! last object, so the pool never keeps a device open.

use std::sync::{Arc, Weak};

use crate::control::Context;

/// The shared objects of every device, each device's oldest first.
pub(crate) struct DevicePool<T> {
    devices: Vec<(Weak<Context>, Vec<Weak<T>>)>,
}

impl<T> Default for DevicePool<T> {
    fn default() -> Self {
        DevicePool {
            devices: Vec::new(),
        }
    }
}

impl<T> DevicePool<T> {
    /// `ctx`'s objects, oldest first, to take from or add to: closed devices and dropped
    /// objects are forgotten first, and a device seen for the first time gets an empty list.
    pub(crate) fn live_on(&mut self, ctx: &Arc<Context>) -> &mut Vec<Weak<T>> {
        self.devices.retain(|(d, _)| d.strong_count() > 0);
        let at = match self.devices.iter().position(|(d, _)| is(d, ctx)) {
            Some(at) => at,
            None => {
                self.devices.push((Arc::downgrade(ctx), Vec::new()));
                self.devices.len() - 1
            }
        };
        let objects = &mut self.devices[at].1;
        objects.retain(|o| o.strong_count() > 0);
        objects
    }

    /// The live objects of `ctx`.
    pub(crate) fn on<'a>(&'a self, ctx: &'a Arc<Context>) -> impl Iterator<Item = Arc<T>> + 'a {
        self.devices
            .iter()
            .filter(move |(d, _)| is(d, ctx))
            .flat_map(|(_, objects)| objects.iter().filter_map(Weak::upgrade))
    }

    /// The live objects of every device.
    pub(crate) fn all(&self) -> impl Iterator<Item = Arc<T>> + '_ {
        self.devices
            .iter()
            .flat_map(|(_, objects)| objects.iter().filter_map(Weak::upgrade))
    }
}

/// Whether `d` is `ctx` (and still open).
fn is(d: &Weak<Context>, ctx: &Arc<Context>) -> bool {
    d.upgrade().is_some_and(|d| Arc::ptr_eq(&d, ctx))
}

#[cfg(all(test, feature = "soft"))]
mod tests {
    use super::*;
    use crate::provider::soft::{register_fabric, unregister_fabric};
    use crate::provider::ProgressModel;
    use crate::ContextConfig;

    #[test]
    fn a_device_keeps_its_objects_in_order_and_dropped_ones_are_forgotten() {
        let f = softnic::Fabric::new(5, std::time::Duration::ZERO);
        f.add_port("198.18.3.1".parse().unwrap());
        f.add_port("198.18.3.2".parse().unwrap());
        register_fabric("device-pool", &f);
        let config = ContextConfig {
            progress: ProgressModel::Manual,
            ..ContextConfig::default()
        };
        let open =
            |port: u32| Context::open(&format!("fabric:device-pool/{port}"), &config).unwrap();
        let (a, b) = (open(0), open(1));
        let mut pool = DevicePool::<u32>::default();
        let (one, two, three) = (Arc::new(1), Arc::new(2), Arc::new(3));
        pool.live_on(&a).push(Arc::downgrade(&one));
        pool.live_on(&a).push(Arc::downgrade(&two));
        pool.live_on(&b).push(Arc::downgrade(&three));
        let on_a: Vec<u32> = pool.on(&a).map(|o| *o).collect();
        assert_eq!(on_a, [1, 2]);
        drop(one);
        assert_eq!(pool.live_on(&a).len(), 1);
        let mut all: Vec<u32> = pool.all().map(|o| *o).collect();
        all.sort();
        assert_eq!(all, [2, 3]);
        drop((a, b));
        unregister_fabric("device-pool");
    }
}
