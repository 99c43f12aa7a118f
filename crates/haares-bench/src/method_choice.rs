//! A method as the benchmarks take it: a residual method and, optionally, the routing path its
//! reads are pinned to (`haares/fused`, `block-attnres/reference`), so that both paths can be
//! measured in one interleaved run. Parsed once, where a command reads its arguments, and written
//! back under its canonical name wherever it travels (to the workers, into the reports' JSON):
//! `block_attnres` comes back as `block-attnres`.

use std::fmt;
use std::str::FromStr;

use haares_core::{ResidualMethod, RoutingPath};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::error::BenchError;

/// A residual method and the routing path its reads take: `name`, `name/reference` or
/// `name/fused` (a bare name lets the backend choose, [`RoutingPath::Auto`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MethodChoice {
    /// The method ([`ResidualMethod`]'s names).
    pub method: ResidualMethod,
    /// The routing path its reads are pinned to.
    pub routing: RoutingPath,
}

impl MethodChoice {
    /// `method` on the path the backend chooses.
    pub fn auto(method: ResidualMethod) -> Self {
        Self {
            method,
            routing: RoutingPath::Auto,
        }
    }

    /// The paper's label, and the pinned path in parentheses: `HAARES (fused)`.
    pub fn label(&self) -> String {
        match self.path_name() {
            Some(path) => format!("{} ({path})", self.method.label()),
            None => self.method.label(),
        }
    }

    /// The method without its path: the model the PyTorch peer trains, which implements each
    /// method once, plainly.
    pub fn unpinned(&self) -> Self {
        Self::auto(self.method)
    }

    fn path_name(&self) -> Option<&'static str> {
        match self.routing {
            RoutingPath::Auto => None,
            RoutingPath::Reference => Some("reference"),
            RoutingPath::Fused => Some("fused"),
        }
    }
}

impl fmt::Display for MethodChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.path_name() {
            Some(path) => write!(f, "{}/{path}", self.method),
            None => self.method.fmt(f),
        }
    }
}

/// A choice is its name: `choice == "haares/fused"` compares the name it writes (names read back
/// as written, so equal names are equal choices).
impl PartialEq<str> for MethodChoice {
    fn eq(&self, name: &str) -> bool {
        self.to_string() == name
    }
}

impl PartialEq<&str> for MethodChoice {
    fn eq(&self, name: &&str) -> bool {
        self == *name
    }
}

impl FromStr for MethodChoice {
    type Err = BenchError;

    fn from_str(text: &str) -> Result<Self, BenchError> {
        let (name, routing) = match text.split_once('/') {
            None => (text, RoutingPath::Auto),
            Some((name, "reference")) => (name, RoutingPath::Reference),
            Some((name, "fused")) => (name, RoutingPath::Fused),
            Some((_, other)) => {
                return Err(BenchError::Request(format!(
                    "unknown routing path `{other}` in method `{text}`; use `/reference` or `/fused`"
                )));
            }
        };
        let method = name
            .parse()
            .map_err(|e: haares_core::HaaresError| BenchError::Request(e.to_string()))?;
        Ok(Self { method, routing })
    }
}

impl Serialize for MethodChoice {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for MethodChoice {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

/// `names` parsed, for the specs' defaults.
///
/// # Panics
/// On a name that is not a method: the callers pass constants.
pub fn methods(names: &[&str]) -> Vec<MethodChoice> {
    names
        .iter()
        .map(|name| name.parse().expect("a method name"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every form reads back as written, pins the path it names, and labels it as the reports do.
    #[test]
    fn a_choice_reads_back_as_written() {
        for (text, routing, label) in [
            ("standard", RoutingPath::Auto, "Standard Residual"),
            ("haares/fused", RoutingPath::Fused, "HAARES (fused)"),
            (
                "block-attnres/reference",
                RoutingPath::Reference,
                "Block AttnRes (reference)",
            ),
            (
                "haares-fixed-bias=-2/fused",
                RoutingPath::Fused,
                "Fixed detail bias -2 (fused)",
            ),
        ] {
            let choice: MethodChoice = text.parse().unwrap();
            assert_eq!(choice.routing, routing, "{text}");
            assert_eq!(choice.to_string(), text);
            assert!(choice == text && choice != "standard/fused");
            assert_eq!(choice.label(), label);
            let json = serde_json::to_string(&choice).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<MethodChoice>(&json).unwrap(), choice);
        }
        let fused: MethodChoice = "haares/fused".parse().unwrap();
        assert_eq!(fused.unpinned().to_string(), "haares");
    }

    /// A misspelt method or path is refused, naming what it read and what it takes.
    #[test]
    fn a_misspelt_choice_is_refused_by_name() {
        let path = "haares/fast".parse::<MethodChoice>().unwrap_err();
        assert!(matches!(path, BenchError::Request(_)), "{path:?}");
        assert!(path.to_string().contains("`fast`"), "{path}");
        assert!(path.to_string().contains("/reference"), "{path}");
        let method = "hares/fused".parse::<MethodChoice>().unwrap_err();
        assert!(matches!(method, BenchError::Request(_)), "{method:?}");
        assert!(method.to_string().contains("`hares`"), "{method}");
        assert!(serde_json::from_str::<MethodChoice>("\"hares\"").is_err());
    }
}
