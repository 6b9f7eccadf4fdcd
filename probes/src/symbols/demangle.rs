//! Demangled names for C++ (Itanium ABI) and Rust (legacy and v0) symbols.

/// A symbol's demangled name and the same name without a parameter list
/// (what a user types in a pattern: `ns::f` for `ns::f(int)`).
pub(crate) struct Demangled {
    pub full: String,
    pub base: Option<String>,
}

/// Demangles `raw`; names that are not mangled come back as they are. A
/// symbol version (`memcpy@@GLIBC_2.14`) is not part of the name.
pub(crate) fn demangle(raw: &str) -> Demangled {
    let raw = match raw.find('@') {
        Some(at) if at > 0 => &raw[..at],
        _ => raw,
    };
    // Rust first: legacy Rust symbols are also valid Itanium C++ names, and
    // only rustc-demangle knows to drop their hash.
    if let Ok(rust) = rustc_demangle::try_demangle(raw) {
        return Demangled { full: format!("{rust:#}"), base: None };
    }
    if raw.starts_with("_Z") {
        if let Ok(symbol) = cpp_demangle::Symbol::new(raw) {
            let options = cpp_demangle::DemangleOptions::default();
            if let Ok(full) = symbol.demangle_with_options(&options) {
                let base = symbol.demangle_with_options(&options.no_params().no_return_type()).ok().filter(|b| *b != full);
                return Demangled { full, base };
            }
        }
    }
    Demangled { full: raw.to_string(), base: None }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpp_names_demangle_with_and_without_parameters() {
        let d = demangle("_ZN6shapes6Circle4areaEv");
        assert_eq!(d.full, "shapes::Circle::area()");
        assert_eq!(d.base.as_deref(), Some("shapes::Circle::area"));
    }

    #[test]
    fn rust_legacy_names_lose_their_hash() {
        let d = demangle("_ZN4core3fmt5write17h0123456789abcdefE");
        assert_eq!(d.full, "core::fmt::write");
    }

    #[test]
    fn symbol_versions_are_dropped() {
        assert_eq!(demangle("__libc_start_main@@GLIBC_2.34").full, "__libc_start_main");
        assert_eq!(demangle("memcpy@GLIBC_2.2.5").full, "memcpy");
    }

    #[test]
    fn c_names_stay() {
        let d = demangle("parse_line");
        assert_eq!(d.full, "parse_line");
        assert!(d.base.is_none());
    }
}
