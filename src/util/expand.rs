//! `${NAME}` in a configured string, from the environment: the kubelet's address in a pod
//! (`https://${NODE_IP}:10250`). Here, not in the kubelet source, so that the config can check a
//! value without importing a source that imports the config.

/// `url` with each `${NAME}` replaced by `var(NAME)`; an unset variable or an unclosed `${` is
/// an error that says which.
pub fn expand(url: &str, var: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(url.len());
    let mut rest = url;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let end = after
            .find('}')
            .ok_or_else(|| format!("unclosed ${{ in {url:?}"))?;
        let name = &after[..end];
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(format!("${{{name}}} is not a variable name"));
        }
        let value = var(name).ok_or_else(|| format!("the environment has no {name}"))?;
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
