//! Choosing functions with patterns.
//!
//! - `parse_*`, `ns::Class::*`: a glob on the demangled name (with or without
//!   parameters) or the raw symbol;
//! - `src/io.c:*`: functions declared in a source file (path suffix or glob);
//! - `libc.so.6:malloc`: functions of one loaded module;
//! - `!pat`: exclusion from what the others (or the default) selected.
//!
//! With no positive pattern, the default is every function of the main
//! executable that has DWARF, minus C runtime scaffolding and the Rust
//! standard library.

use crate::error::{Error, Result};
use crate::symbols::{Function, SymbolIndex};
use globset::{Glob, GlobBuilder, GlobMatcher};
use std::collections::BTreeSet;
use std::path::Path;

/// A parsed `-f` pattern.
#[derive(Clone, Debug)]
struct Pattern {
    text: String,
    exclude: bool,
    scope: Scope,
    name: GlobMatcher,
}

#[derive(Clone, Debug)]
enum Scope {
    /// Functions of the main executable.
    Main,
    /// Functions of modules whose file name matches.
    Module(String),
    /// Functions of the main executable declared in matching source files.
    File(GlobMatcher),
}

/// A set of `-f` patterns.
#[derive(Clone, Debug, Default)]
pub struct Selection {
    patterns: Vec<Pattern>,
}

/// One selected function: the module (index into the slice given to
/// [`Selection::select`]) and the function (index into its `functions`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Selected {
    /// Index of the module.
    pub module: usize,
    /// Index of the function in that module.
    pub function: usize,
}

impl Selection {
    /// Parses patterns as given on the command line.
    pub fn parse<S: AsRef<str>>(patterns: &[S]) -> Result<Self> {
        let patterns = patterns.iter().map(|p| parse_one(p.as_ref())).collect::<Result<_>>()?;
        Ok(Selection { patterns })
    }

    /// Whether no positive pattern was given (the default set applies).
    pub fn is_default(&self) -> bool {
        self.patterns.iter().all(|p| p.exclude)
    }

    /// Whether a pattern names the module at `path` (so its symbols must be read).
    pub fn names_module(&self, path: &Path) -> bool {
        self.patterns.iter().any(|p| matches!(&p.scope, Scope::Module(name) if module_matches(name, path)))
    }

    /// Whether the patterns name functions of modules other than the
    /// executable at `main` only (`-f 'libc.so.6:malloc'`): its own symbols
    /// are then not needed.
    pub fn names_other_modules_only(&self, main: &Path) -> bool {
        let included = || self.patterns.iter().filter(|p| !p.exclude);
        included().next().is_some() && included().all(|p| matches!(&p.scope, Scope::Module(name) if !module_matches(name, main)))
    }

    /// Selects functions among `modules`; the first is the main executable.
    /// A positive pattern that selects nothing is an error naming it.
    pub fn select(&self, modules: &[&SymbolIndex]) -> Result<Vec<Selected>> {
        let mut chosen = BTreeSet::new();
        if self.is_default()
            && let Some(main) = modules.first()
        {
            chosen.extend(
                main.functions
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| is_default_function(main, f))
                    .map(|(function, _)| Selected { module: 0, function }),
            );
        }
        for pattern in self.patterns.iter().filter(|p| !p.exclude) {
            let matches = self.matching(pattern, modules);
            if matches.is_empty() {
                return Err(no_match(pattern, modules));
            }
            chosen.extend(matches);
        }
        for pattern in self.patterns.iter().filter(|p| p.exclude) {
            for hit in self.matching(pattern, modules) {
                chosen.remove(&hit);
            }
        }
        Ok(chosen.into_iter().collect())
    }

    fn matching(&self, pattern: &Pattern, modules: &[&SymbolIndex]) -> Vec<Selected> {
        let mut out = Vec::new();
        for (m, index) in modules.iter().enumerate() {
            let in_scope = match &pattern.scope {
                Scope::Main | Scope::File(_) => m == 0,
                Scope::Module(name) => module_matches(name, &index.path),
            };
            if !in_scope {
                continue;
            }
            for (i, f) in index.functions.iter().enumerate() {
                if f.is_cold_part() {
                    continue;
                }
                if let Scope::File(file) = &pattern.scope {
                    match index.decl_path(f) {
                        Some(path) if file.is_match(path) => {}
                        _ => continue,
                    }
                }
                if f.names().any(|n| pattern.name.is_match(n)) {
                    out.push(Selected { module: m, function: i });
                }
            }
        }
        out
    }
}

/// Whether a function belongs to the default selection of the main executable.
pub fn is_default_function(index: &SymbolIndex, f: &Function) -> bool {
    f.has_dwarf && !f.is_scaffolding() && !f.is_cold_part() && !index.decl_path(f).is_some_and(is_rust_runtime_source)
}

/// The Rust standard library and its vendored dependencies are built with
/// these path prefixes (`--remap-path-prefix` of the Rust distribution).
fn is_rust_runtime_source(path: &str) -> bool {
    path.starts_with("/rustc/") || path.starts_with("/rust/deps/")
}

fn parse_one(text: &str) -> Result<Pattern> {
    let bad = |reason: &str| Error::BadPattern { pattern: text.into(), reason: reason.into() };
    let (exclude, body) = match text.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if body.is_empty() {
        return Err(bad("it is empty"));
    }
    let (scope, name) = match split_scope(body) {
        Some((prefix, name)) if looks_like_module(prefix) => (Scope::Module(prefix.into()), name),
        Some((prefix, name)) => {
            let file_glob =
                if prefix.starts_with('/') || prefix.starts_with("**") { prefix.to_string() } else { format!("{{{prefix},**/{prefix}}}") };
            let matcher =
                GlobBuilder::new(&file_glob).literal_separator(true).build().map_err(|e| bad(&e.kind().to_string()))?.compile_matcher();
            (Scope::File(matcher), name)
        }
        None => (Scope::Main, body),
    };
    if name.is_empty() {
        return Err(bad("nothing follows the ':'; write FILE:* for every function of a file"));
    }
    let name = Glob::new(name).map_err(|e| bad(&e.kind().to_string()))?.compile_matcher();
    Ok(Pattern { text: text.into(), exclude, scope, name })
}

/// Splits `prefix:name` at a single colon; `::` belongs to C++ and Rust names.
fn split_scope(body: &str) -> Option<(&str, &str)> {
    let bytes = body.as_bytes();
    let at = (0..bytes.len()).find(|&i| bytes[i] == b':' && bytes.get(i + 1) != Some(&b':') && (i == 0 || bytes[i - 1] != b':'))?;
    Some((&body[..at], &body[at + 1..]))
}

fn looks_like_module(prefix: &str) -> bool {
    let file_name = prefix.rsplit('/').next().unwrap_or(prefix);
    file_name.starts_with("lib") && !has_source_extension(file_name) || file_name.contains(".so")
}

fn has_source_extension(name: &str) -> bool {
    const EXTENSIONS: &[&str] = &["c", "cc", "cpp", "cxx", "c++", "h", "hh", "hpp", "hxx", "rs", "i", "ii", "s", "S", "inl", "tcc"];
    name.rsplit_once('.').is_some_and(|(_, ext)| EXTENSIONS.contains(&ext))
}

/// `libc.so.6`, `libc.so` and `libc` all name `/usr/lib/x86_64-linux-gnu/libc.so.6`.
fn module_matches(prefix: &str, path: &Path) -> bool {
    let Some(file_name) = path.file_name().and_then(|n| n.to_str()) else { return false };
    if let Ok(glob) = Glob::new(prefix) {
        if glob.compile_matcher().is_match(file_name) || glob.compile_matcher().is_match(path) {
            return true;
        }
    }
    file_name.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('.'))
}

fn no_match(pattern: &Pattern, modules: &[&SymbolIndex]) -> Error {
    // The module the pattern searched: the named library, or the executable.
    let searched = match &pattern.scope {
        Scope::Module(name) => modules.iter().find(|m| module_matches(name, &m.path)).copied(),
        Scope::Main | Scope::File(_) => modules.first().copied(),
    };
    let binary = searched.or(modules.first().copied()).map(|m| m.path.clone()).unwrap_or_default();
    let hint = match (&pattern.scope, searched) {
        (Scope::Module(name), None) => format!("; no module named '{name}' is part of the target"),
        (Scope::File(_), Some(m)) if m.functions.iter().all(|f| f.decl_file.is_none()) => {
            "; source-file patterns need debug info, and it has none".into()
        }
        (_, Some(m)) if m.functions.iter().all(|f| f.origin == crate::symbols::SymbolOrigin::Dynsym) => {
            "; it is stripped, so only exported functions are known".into()
        }
        // A list given as one pattern (C++ names hold commas of their own).
        _ if pattern.text.contains(',') && !pattern.text.contains('<') && !pattern.text.contains('(') => {
            "; it is one pattern, not a list: give each pattern on its own".into()
        }
        _ => String::new(),
    };
    Error::NoMatch { pattern: pattern.text.clone(), binary, hint }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colons_of_names_are_not_scopes() {
        assert_eq!(split_scope("ns::Class::*"), None);
        assert_eq!(split_scope("src/io.c:*"), Some(("src/io.c", "*")));
        assert_eq!(split_scope("libc.so.6:malloc"), Some(("libc.so.6", "malloc")));
        assert_eq!(split_scope("libstd.so:std::fs::*"), Some(("libstd.so", "std::fs::*")));
    }

    #[test]
    fn modules_and_files_are_told_apart() {
        assert!(looks_like_module("libc.so.6"));
        assert!(looks_like_module("libm"));
        assert!(!looks_like_module("src/io.c"));
        assert!(!looks_like_module("lib/parse.c"));
        assert!(module_matches("libc", Path::new("/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(module_matches("libc.so.6", Path::new("/lib/x86_64-linux-gnu/libc.so.6")));
        assert!(!module_matches("libc", Path::new("/lib/libcrypt.so.1")));
    }

    #[test]
    fn file_scopes_match_at_path_boundaries() {
        let Pattern { scope: Scope::File(m), .. } = parse_one("src/io.c:*").expect("valid") else { panic!("file scope") };
        assert!(m.is_match("/home/u/proj/src/io.c"));
        assert!(m.is_match("src/io.c"));
        assert!(!m.is_match("/home/u/proj/mysrc/io.c"));
    }

    #[test]
    fn bad_patterns_are_sentences() {
        let err = parse_one("!").expect_err("empty");
        assert!(err.to_string().contains("'!'"));
        let err = parse_one("a.c:").expect_err("no name");
        assert!(err.to_string().contains("FILE:*"));
        assert!(parse_one("f[").is_err());
    }
}
