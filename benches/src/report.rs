//! The JSON report a benchmark writes: a flat object of named figures. Figures from several
//! measurements of one run go into one report; later benchmarks add keys beside the existing
//! ones without changing those.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

/// Named figures, written as one JSON object with keys in sorted order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Report {
    figures: BTreeMap<String, serde_json::Value>,
}

impl Report {
    /// An empty report.
    pub fn new() -> Report {
        Report::default()
    }

    /// Sets a number.
    pub fn number(&mut self, key: &str, value: f64) -> &mut Report {
        let v = serde_json::Number::from_f64(value)
            .map(serde_json::Value::Number)
            .unwrap_or(serde_json::Value::Null);
        self.figures.insert(key.to_string(), v);
        self
    }

    /// Sets a string (a configuration detail worth keeping beside the numbers).
    pub fn text(&mut self, key: &str, value: &str) -> &mut Report {
        self.figures.insert(
            key.to_string(),
            serde_json::Value::String(value.to_string()),
        );
        self
    }

    /// A number previously set.
    pub fn get(&self, key: &str) -> Option<f64> {
        self.figures.get(key).and_then(|v| v.as_f64())
    }

    /// The report as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        let map: serde_json::Map<String, serde_json::Value> = self
            .figures
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        serde_json::to_string_pretty(&serde_json::Value::Object(map))
            .expect("a map of numbers and strings always serialises")
    }

    /// Writes the report to `path`.
    pub fn write(&self, path: &Path) -> io::Result<()> {
        std::fs::write(path, self.to_json() + "\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_are_written_as_one_flat_object_in_key_order() {
        let mut r = Report::new();
        r.number("post_single_ns", 12.5)
            .number("floor_copy64_ns", 1.0)
            .text("provider", "soft");
        let v: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(v["post_single_ns"], 12.5);
        assert_eq!(v["provider"], "soft");
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, vec!["floor_copy64_ns", "post_single_ns", "provider"]);
    }

    #[test]
    fn a_number_that_is_not_finite_becomes_null() {
        let mut r = Report::new();
        r.number("x", f64::NAN);
        assert_eq!(r.get("x"), None);
        assert!(r.to_json().contains("null"));
    }
}
