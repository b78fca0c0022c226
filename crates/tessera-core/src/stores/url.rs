//! What the stores whose URLs carry credentials share in parsing them: the message for a URL
//! that does not parse, and percent-decoding of user names, passwords and query values.
//! Redaction for show is [`crate::error::redact_url`], used by every store.

/// Why `url::Url::parse` refused a store URL, with the usual cause: a user name or password
/// holding `#`, `/`, `?`, `@` or `:` unencoded (a `#` starts a fragment, so the port reads as
/// garbage).
#[cfg(any(feature = "redis", feature = "mysql", feature = "postgres"))]
pub fn not_a_url(e: url::ParseError) -> String {
    format!(
        "not a URL ({e}); characters such as # / ? @ : in a user name or password must be \
         percent-encoded (# as %23, / as %2F, ? as %3F, @ as %40, : as %3A)"
    )
}

/// Percent-decodes a URL component: `None` if a `%` is not followed by two hex digits, or if
/// the bytes are not UTF-8 afterwards.
#[cfg(any(feature = "mysql", feature = "postgres", feature = "etcd"))]
pub fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(all(test, any(feature = "mysql", feature = "postgres", feature = "etcd")))]
mod tests {
    use super::percent_decode;

    #[test]
    fn percent_decoding_is_strict() {
        assert_eq!(
            percent_decode("hun%40ter2%2F").as_deref(),
            Some("hun@ter2/")
        );
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("a%4"), None);
        assert_eq!(percent_decode("a%zz"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
    }
}
