//! A sample's `categories`: where the measured step's memory went (docs/categories.md).
//! Checked whole; one bad value refuses the sample, naming the field and what to send. Keys
//! this daemon does not know are skipped, so a newer client's extra figures are no error.

use serde_json::Value;

use super::{byte_value, not_a, too_long, Code, Rejection};
use crate::core::categories::{Categories, MAX_BATCH};

/// Most `partial` reasons kept, and the longest (the client sends a handful of short ones).
const MAX_PARTIAL: usize = 16;
const MAX_REASON: usize = 512;

pub(super) fn categories(v: Option<Value>) -> Result<Option<Box<Categories>>, Rejection> {
    let map = match v {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Object(map)) => map,
        Some(other) => {
            return Err(not_a(
                "categories",
                &other,
                "an object of byte counts (docs/categories.md)",
            ))
        }
    };
    let field = |name: &str| map.get(name).cloned();
    let need = |name: &str| -> Result<u64, Rejection> {
        byte_value(&format!("categories.{name}"), field(name))?.ok_or_else(|| {
            Rejection::new(
                Code::BadField,
                format!("categories needs \"{name}\" (an integer count of bytes)"),
            )
        })
    };
    let step = match field("step") {
        Some(Value::Number(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or(0),
        None | Some(Value::Null) => {
            return Err(Rejection::new(
                Code::BadField,
                "categories needs \"step\" (the step the split was measured at)",
            ))
        }
        Some(other) => return Err(not_a("categories.step", &other, "a step number")),
    };
    let batch_size = match field("batch_size") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) if n.as_u64().is_some_and(|b| b <= MAX_BATCH) => n.as_u64(),
        Some(other) => {
            return Err(not_a(
                "categories.batch_size",
                &other,
                "a batch size (an integer up to 2^24, the most the batch fit answers, or null)",
            ))
        }
    };
    let c = Categories {
        step,
        parameters_bytes: need("parameters_bytes")?,
        gradients_bytes: need("gradients_bytes")?,
        optimizer_state_bytes: need("optimizer_state_bytes")?,
        buffers_bytes: need("buffers_bytes")?,
        activations_bytes: need("activations_bytes")?,
        batch_size,
        fp32_bytes: byte_value("categories.fp32_bytes", field("fp32_bytes"))?,
        partial: partial(map.get("partial"))?,
    };
    // fp32_bytes is a part of parameters and gradients: more would size a bf16 remedy that
    // frees memory the split never held.
    let whole = c.parameters_bytes.saturating_add(c.gradients_bytes);
    if let Some(f) = c.fp32_bytes.filter(|f| *f > whole) {
        return Err(Rejection::new(
            Code::BadField,
            format!(
                "categories.fp32_bytes is {f}, more than parameters_bytes + gradients_bytes \
                 ({whole}); send the float32 part of those two (0 for a bf16 model)"
            ),
        ));
    }
    Ok(Some(Box::new(c)))
}

fn partial(v: Option<&Value>) -> Result<Vec<String>, Rejection> {
    let list = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(list)) => list,
        Some(other) => return Err(not_a("categories.partial", other, "a list of reasons")),
    };
    if list.len() > MAX_PARTIAL {
        return Err(Rejection::new(
            Code::BadField,
            format!(
                "categories.partial lists {} reasons; at most {MAX_PARTIAL} are accepted",
                list.len()
            ),
        ));
    }
    list.iter()
        .enumerate()
        .map(|(i, r)| match r {
            Value::String(s) if s.len() <= MAX_REASON => Ok(s.clone()),
            Value::String(s) => Err(too_long(&format!("categories.partial[{i}]"), s, MAX_REASON)),
            other => Err(not_a(
                &format!("categories.partial[{i}]"),
                other,
                "a reason (text)",
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests;
