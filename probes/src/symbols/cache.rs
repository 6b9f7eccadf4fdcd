//! Each binary of a recording read once: its ELF image and its symbol
//! index, shared by planning, line planning and the sampler, whatever
//! thread asks.

use super::{DebugDirs, Debuginfod, ElfImage, FetchProgress, LoadOptions, SymbolIndex};
use crate::error::Result;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

/// Images and indexes by module, as the process names it.
#[derive(Default)]
pub struct SymbolCache {
    debug_dirs: DebugDirs,
    debuginfod: Option<Debuginfod>,
    kept_reads: Option<PathBuf>,
    modules: Mutex<HashMap<PathBuf, Cached>>,
}

#[derive(Default, Clone)]
struct Cached {
    image: Option<Arc<ElfImage>>,
    index: Option<Arc<SymbolIndex>>,
    /// Whether the index holds the line rows.
    lines: bool,
    /// Whether it holds the DWARF's functions (not the symbol tables' alone).
    full: bool,
}

impl SymbolCache {
    /// A cache that finds separate debug files in `debug_dirs`.
    pub fn new(debug_dirs: DebugDirs) -> Self {
        SymbolCache { debug_dirs, debuginfod: None, kept_reads: None, modules: Mutex::default() }
    }

    /// The same cache, asking `debuginfod` for debug info found nowhere on disk.
    pub fn with_debuginfod(self, debuginfod: Option<Debuginfod>) -> Self {
        SymbolCache { debuginfod, ..self }
    }

    /// The same cache, keeping what it reads of binaries in `dir` for the next
    /// recording of the same binaries (see [`LoadOptions::kept_reads`]).
    pub fn keeping_reads_in(self, dir: Option<PathBuf>) -> Self {
        SymbolCache { kept_reads: dir, ..self }
    }

    fn cached(&self, module: &Path) -> Cached {
        self.modules.lock().unwrap_or_else(PoisonError::into_inner).get(module).cloned().unwrap_or_default()
    }

    fn keep(&self, module: &Path, cached: Cached) {
        self.modules.lock().unwrap_or_else(PoisonError::into_inner).insert(module.to_path_buf(), cached);
    }

    /// The image of `module`, opened through `open` (a path into the
    /// process's mount namespace, say) the first time.
    pub fn image(&self, module: &Path, open: &Path) -> Result<Arc<ElfImage>> {
        let mut cached = self.cached(module);
        if let Some(image) = &cached.image {
            return Ok(image.clone());
        }
        let image = Arc::new(ElfImage::open(open)?);
        cached.image = Some(image.clone());
        self.keep(module, cached);
        Ok(image)
    }

    /// The symbols of `module` (named so in the index), with its line rows
    /// when `lines`: read the first time, or again when lines are wanted
    /// and were not read. Debuginfod's cache is read, its servers are not
    /// asked: this serves the sampler while the program runs, which a
    /// download would stall.
    pub fn index(&self, module: &Path, open: &Path, lines: bool) -> Result<Arc<SymbolIndex>> {
        let cache_only = self.debuginfod.as_ref().map(Debuginfod::cache_only);
        self.index_with(module, open, (lines, true), cache_only, &super::Unheard)
    }

    /// An index that names the functions of `module` for its samples: the
    /// one read already, else one from its symbol tables (see
    /// [`LoadOptions::symbol_tables_enough`]). Never downloads.
    pub fn names(&self, module: &Path, open: &Path) -> Result<Arc<SymbolIndex>> {
        let cache_only = self.debuginfod.as_ref().map(Debuginfod::cache_only);
        self.index_with(module, open, (false, false), cache_only, &super::Unheard)
    }

    /// [`SymbolCache::names`], downloading debug info from debuginfod
    /// servers when the files have no symbol table and the disk no debug
    /// file, and telling `progress`.
    pub fn names_fetching(&self, module: &Path, open: &Path, progress: &dyn FetchProgress) -> Result<Arc<SymbolIndex>> {
        self.index_with(module, open, (false, false), self.debuginfod.clone(), progress)
    }

    /// The same, downloading debug info from debuginfod servers when
    /// neither the disk nor the cache has it, and telling `progress`.
    pub fn index_fetching(&self, module: &Path, open: &Path, lines: bool, progress: &dyn FetchProgress) -> Result<Arc<SymbolIndex>> {
        self.index_with(module, open, (lines, true), self.debuginfod.clone(), progress)
    }

    fn index_with(
        &self,
        module: &Path,
        open: &Path,
        (lines, full): (bool, bool),
        debuginfod: Option<Debuginfod>,
        progress: &dyn FetchProgress,
    ) -> Result<Arc<SymbolIndex>> {
        let cached = self.cached(module);
        if let Some(index) = cached.index.as_ref().filter(|_| (cached.lines || !lines) && (cached.full || !full)) {
            return Ok(index.clone());
        }
        let image = self.image(module, open)?;
        let options = LoadOptions {
            lines,
            debug_dirs: self.debug_dirs.clone(),
            debuginfod,
            symbol_tables_enough: !full,
            kept_reads: self.kept_reads.clone(),
        };
        let mut index = SymbolIndex::of_image_observed(&image, &options, progress)?;
        index.path = module.to_path_buf();
        let index = Arc::new(index);
        self.keep(module, Cached { image: Some(image), index: Some(index.clone()), lines, full });
        Ok(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampled_frames_are_named_from_the_symbol_tables_until_more_is_asked() {
        let exe = std::env::current_exe().expect("this test's program");
        let cache = SymbolCache::default();
        let names = cache.names(Path::new("/lib"), &exe).expect("names");
        assert!(!names.functions.is_empty());
        let full = cache.index(Path::new("/lib"), &exe, false).expect("index");
        assert!(!Arc::ptr_eq(&names, &full), "planning needs the DWARF's functions");
        assert!(Arc::ptr_eq(&full, &cache.names(Path::new("/lib"), &exe).expect("the full index serves")));
    }

    #[test]
    fn a_binary_is_read_once_and_again_only_for_its_lines() {
        let exe = std::env::current_exe().expect("this test's program");
        let cache = SymbolCache::default();
        let first = cache.index(Path::new("/shown/as"), &exe, false).expect("index");
        assert_eq!(first.path, Path::new("/shown/as"));
        assert!(Arc::ptr_eq(&first, &cache.index(Path::new("/shown/as"), &exe, false).expect("again")));
        let with_lines = cache.index(Path::new("/shown/as"), &exe, true).expect("lines");
        assert!(!Arc::ptr_eq(&first, &with_lines));
        assert!(Arc::ptr_eq(&with_lines, &cache.index(Path::new("/shown/as"), &exe, false).expect("lines serve")));
        assert!(Arc::ptr_eq(
            &cache.image(Path::new("/shown/as"), &exe).expect("image"),
            &cache.image(Path::new("/shown/as"), &exe).expect("image")
        ));
    }
}
