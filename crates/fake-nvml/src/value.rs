//! Values that change over scenario time: a constant, a timeline, or "n/a".

use serde::de::{self, value::MapAccessDeserializer, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// A number, a timeline of numbers over scenario seconds, or `"n/a"`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Const(f64),
    Timeline(Timeline),
    /// `"n/a"`: only meaningful for process memory (`NVML_VALUE_NOT_AVAILABLE`); the scenario
    /// validator rejects it elsewhere.
    NotAvailable,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Timeline {
    /// (seconds, value), times non-decreasing, at least one point.
    points: Vec<(f64, f64)>,
    step: bool,
    repeat: Option<f64>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Interp {
    #[default]
    Linear,
    Step,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeline {
    points: Vec<(f64, f64)>,
    #[serde(default)]
    interp: Interp,
    repeat: Option<f64>,
}

impl Timeline {
    fn new(raw: RawTimeline) -> Result<Self, String> {
        if raw.points.is_empty() {
            return Err("a timeline needs at least one point in `points`".into());
        }
        let mut prev = f64::NEG_INFINITY;
        for (i, &(t, v)) in raw.points.iter().enumerate() {
            if !t.is_finite() || !v.is_finite() {
                return Err(format!("points[{i}] = [{t}, {v}] is not finite"));
            }
            if t < prev {
                return Err(format!(
                    "points[{i}] time {t} is before the previous point's time {prev}; times must not decrease"
                ));
            }
            prev = t;
        }
        if let Some(r) = raw.repeat {
            if !(r.is_finite() && r > 0.0) {
                return Err(format!("repeat = {r} must be a positive number of seconds"));
            }
            if prev > r {
                return Err(format!(
                    "repeat = {r} is shorter than the last point's time {prev}"
                ));
            }
        }
        Ok(Timeline {
            points: raw.points,
            step: matches!(raw.interp, Interp::Step),
            repeat: raw.repeat,
        })
    }

    fn at(&self, t: f64) -> f64 {
        let t = match self.repeat {
            Some(period) => t.rem_euclid(period),
            None => t,
        };
        // Index of the first point strictly after t; the point in force is the one before it.
        let after = self.points.partition_point(|&(pt, _)| pt <= t);
        if after == 0 {
            return self.points[0].1;
        }
        let (t0, v0) = self.points[after - 1];
        match self.points.get(after) {
            Some(&(t1, v1)) if !self.step && t1 > t0 => v0 + (v1 - v0) * (t - t0) / (t1 - t0),
            _ => v0,
        }
    }
}

impl Value {
    /// The value at scenario time `t`; `None` for "n/a".
    pub fn at(&self, t: f64) -> Option<f64> {
        match self {
            Value::Const(v) => Some(*v),
            Value::Timeline(tl) => Some(tl.at(t)),
            Value::NotAvailable => None,
        }
    }

    pub fn is_not_available(&self) -> bool {
        matches!(self, Value::NotAvailable)
    }
}

/// Converts a scenario number to an unsigned integer: negative and NaN become 0, and `as`
/// saturates at the top, so no input can panic.
pub fn to_u64(v: f64) -> u64 {
    if v.is_nan() || v <= 0.0 {
        0
    } else {
        v.round() as u64
    }
}

pub fn to_u32(v: f64) -> u32 {
    to_u64(v).min(u64::from(u32::MAX)) as u32
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(r#"a number, "n/a", or a timeline { points = [[t, v], ...] }"#)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Const(v as f64))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Const(v as f64))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        if v.is_finite() {
            Ok(Value::Const(v))
        } else {
            Err(E::custom(format!("{v} is not a finite number")))
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        if v == "n/a" {
            Ok(Value::NotAvailable)
        } else {
            Err(E::custom(format!(
                r#"expected a number, "n/a", or a timeline table, found the string "{v}""#
            )))
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Value, A::Error> {
        let raw = RawTimeline::deserialize(MapAccessDeserializer::new(map))?;
        Timeline::new(raw)
            .map(Value::Timeline)
            .map_err(de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct Doc {
        v: Value,
    }

    fn parse(s: &str) -> Result<Value, String> {
        toml::from_str::<Doc>(s)
            .map(|d| d.v)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn constants_and_na() {
        assert_eq!(parse("v = 5").unwrap().at(100.0), Some(5.0));
        assert_eq!(parse("v = 2.5").unwrap().at(0.0), Some(2.5));
        assert_eq!(parse(r#"v = "n/a""#).unwrap().at(0.0), None);
        assert!(parse(r#"v = "lots""#).unwrap_err().contains("lots"));
    }

    #[test]
    fn linear_ramp_holds_ends() {
        let v = parse("v = { points = [[0, 0], [10, 100]] }").unwrap();
        assert_eq!(v.at(-1.0), Some(0.0));
        assert_eq!(v.at(2.5), Some(25.0));
        assert_eq!(v.at(10.0), Some(100.0));
        assert_eq!(v.at(99.0), Some(100.0));
    }

    #[test]
    fn step_and_repeat() {
        let v =
            parse(r#"v = { points = [[0, 1], [5, 2]], interp = "step", repeat = 10 }"#).unwrap();
        assert_eq!(v.at(4.9), Some(1.0));
        assert_eq!(v.at(5.0), Some(2.0));
        assert_eq!(v.at(9.9), Some(2.0));
        assert_eq!(v.at(10.0), Some(1.0));
        assert_eq!(v.at(15.5), Some(2.0));
    }

    #[test]
    fn timeline_errors_name_the_problem() {
        let e = parse("v = { points = [] }").unwrap_err();
        assert!(e.contains("at least one point"), "{e}");
        let e = parse("v = { points = [[5, 1], [1, 2]] }").unwrap_err();
        assert!(e.contains("must not decrease"), "{e}");
        let e = parse("v = { points = [[0, 1]], interp = \"cubic\" }").unwrap_err();
        assert!(e.contains("cubic"), "{e}");
        let e = parse("v = { points = [[0, 1]], bogus = 1 }").unwrap_err();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn conversions_never_panic() {
        assert_eq!(to_u64(-3.0), 0);
        assert_eq!(to_u64(f64::NAN), 0);
        assert_eq!(to_u64(1e30), u64::MAX);
        assert_eq!(to_u32(1e12), u32::MAX);
    }
}
