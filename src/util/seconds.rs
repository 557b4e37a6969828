//! Seconds as settings files write them, read by config and by the parts whose settings it
//! holds alike.

use serde::{Deserialize, Deserializer};

/// Seconds as a TOML float or integer (`120.0` or `120`).
pub fn de_seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Seconds {
        Int(i64),
        Float(f64),
    }
    Ok(match Seconds::deserialize(d)? {
        Seconds::Int(i) => i as f64,
        Seconds::Float(f) => f,
    })
}
