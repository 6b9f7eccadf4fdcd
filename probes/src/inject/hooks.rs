//! Where unwinders start reading a thread's stack and where handlers catch.
//!
//! A hijacked return address points into the runtime, where no unwind
//! information is: an unwinder meeting it stops (a C++ exception would
//! terminate the program, `backtrace()` would come back short). So the
//! entries of the unwinders are patched too, to put the thread's original
//! return addresses back first ("unhook"), and the places a handler catches
//! an exception hijack the live frames' returns again ("rehook"), as
//! uftrace does through `LD_PRELOAD`; a running process needs its own
//! patching for it. After a `backtrace()`, the thread's next call rehooks.

use super::patch::Site;
use super::patcher::Target;
use crate::procfs::LoadedModule;
use crate::symbols::ElfImage;
use object::{Object, ObjectSymbol, SymbolKind};

/// What a hooked entry does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// An unwinder starts: the original return addresses go back.
    Unhook,
    /// A handler catches: frames below are gone, the rest are hijacked again.
    Rehook,
    /// An unwinder that only reads the stack (`backtrace()`): unhooked at
    /// its entry, the live frames are hijacked again at its returns.
    Walk,
    /// glibc links libgcc_s's unwinder, which it loads only when first
    /// needed (a thread cancelled, `pthread_exit`, `backtrace`), too late
    /// for libgcc_s's entries to be patched: a cancelled thread takes the
    /// link just before it unwinds, so it is unhooked there, as at
    /// [`Hook::Unhook`]; but not where `pthread_cancel` takes it in the
    /// thread that cancels another ([`Hooks::canceller`]), which goes on.
    UnwinderLink,
    /// A thread or a process is about to start: counts made without
    /// `lock` until then (edge counters', entries' after a throttle) are
    /// made atomic.
    ThreadStart,
    /// A thread that may share its creator's thread pointer is about to
    /// start (`clone`): the runtime takes a thread's block atomically from
    /// then on, and it is a thread start too.
    Clone,
    /// A `longjmp` starts: the frames it leaves end there, not when the
    /// thread is next seen.
    Jump,
}

impl Hook {
    /// Whether a thread or a process starts here.
    pub fn starts_thread(self) -> bool {
        matches!(self, Hook::ThreadStart | Hook::Clone)
    }
}

/// The entry points, by symbol name. A thread starts in `pthread_create`
/// (which `thrd_create` calls at the same code, and which gives it a
/// thread pointer of its own) or `clone` (which may not), a process
/// that shares the counters in `fork` or `_Fork`; `vfork` and
/// `posix_spawn` suspend the parent until the child executes.
const HOOKS: [(&str, Hook); 18] = [
    ("pthread_create", Hook::ThreadStart),
    ("clone", Hook::Clone),
    ("fork", Hook::ThreadStart),
    ("_Fork", Hook::ThreadStart),
    ("_Unwind_RaiseException", Hook::Unhook),
    ("_Unwind_Resume", Hook::Unhook),
    ("_Unwind_Resume_or_Rethrow", Hook::Unhook),
    (FORCED_UNWIND, Hook::Unhook),
    ("_Unwind_Backtrace", Hook::Walk),
    // glibc loads libgcc_s only when these first need it.
    ("backtrace", Hook::Walk),
    ("pthread_exit", Hook::Unhook),
    (UNWINDER_LINK, Hook::UnwinderLink),
    ("__cxa_begin_catch", Hook::Rehook),
    // Where a foreign exception caught by Rust's catch_unwind is freed.
    ("_Unwind_DeleteException", Hook::Rehook),
    // glibc's jumps (`longjmp`, `_longjmp` and `siglongjmp` one code).
    ("longjmp", Hook::Jump),
    ("_longjmp", Hook::Jump),
    ("siglongjmp", Hook::Jump),
    (GLIBC_CHECKED_JUMP, Hook::Jump),
];

/// glibc's `longjmp` checked by `_FORTIFY_SOURCE`, which no other C library has.
const GLIBC_CHECKED_JUMP: &str = "__longjmp_chk";

/// Names of glibc's jumps no other C library has: a module that defines
/// one is glibc, or a program linked with it statically (which has the
/// checked one only where it calls it).
const GLIBC_JUMPS: [&str; 3] = [GLIBC_CHECKED_JUMP, "__libc_siglongjmp", "__libc_longjmp"];

/// Where a Rust panic caught by `catch_unwind` is freed (a mangled name).
const RUST_PANIC_CLEANUP: &str = "__rust_panic_cleanup";

/// libgcc_s's entry that unwinds a cancelled or exiting thread.
pub const FORCED_UNWIND: &str = "_Unwind_ForcedUnwind";

/// glibc's link to libgcc_s's unwinder (since glibc 2.34).
const UNWINDER_LINK: &str = "__libc_unwind_link_get";

/// What cancels a thread, and takes [`UNWINDER_LINK`] to check that the
/// unwinder can be had.
const CANCELLER: &str = "pthread_cancel";

/// The hook of the function named `name`, if it is one.
fn hook_of(name: &str) -> Option<(&'static str, Hook)> {
    if name.ends_with(RUST_PANIC_CLEANUP) {
        return Some((RUST_PANIC_CLEANUP, Hook::Rehook));
    }
    HOOKS.iter().find(|(n, _)| *n == name).copied()
}

/// Whether, while a call of the function named `name` runs, the return
/// addresses of the frames that called it are their own again rather
/// than trampolines (an unwinder's entry, `backtrace`): those calls go on
/// being timed though no trampoline holds their returns.
pub fn puts_returns_back(name: &str) -> bool {
    // glibc's `backtrace` is a weak alias of `__backtrace`, the name frames get.
    let hook = hook_of(name).or_else(|| hook_of(name.strip_prefix("__")?));
    hook.is_some_and(|(_, hook)| matches!(hook, Hook::Unhook | Hook::Walk))
}

/// An entry to hook.
#[derive(Clone, Debug)]
pub struct HookSite {
    /// Its symbol.
    pub name: &'static str,
    /// What it does.
    pub hook: Hook,
    /// Where its code is.
    pub target: Target,
}

/// What a process's modules have to hook.
#[derive(Clone, Debug, Default)]
pub struct Hooks {
    /// The entries to hook.
    pub sites: Vec<HookSite>,
    /// Where `pthread_cancel`'s code is in the process (runtime addresses),
    /// which [`Hook::UnwinderLink`] leaves alone.
    pub canceller: Option<std::ops::Range<u64>>,
}

/// The hook sites defined in `modules`.
pub fn find(modules: &[LoadedModule]) -> Hooks {
    let mut hooks = Hooks::default();
    let sites = &mut hooks.sites;
    for module in modules {
        let Ok(image) = ElfImage::open(&module.open_path) else { continue };
        let (Ok(elf), Ok(segments)) = (image.parse(), image.segments()) else { continue };
        let mut canceller = None;
        let mut glibc = false;
        for symbol in elf.symbols().chain(elf.dynamic_symbols()) {
            // An IFUNC's symbol is its resolver's, never the code called.
            let ifunc =
                matches!(symbol.flags(), object::SymbolFlags::Elf { st_info, .. } if st_info.st_type() == object::elf::STT_GNU_IFUNC);
            if symbol.kind() != SymbolKind::Text || symbol.is_undefined() || symbol.size() == 0 || ifunc {
                continue;
            }
            let Ok(name) = symbol.name() else { continue };
            glibc |= GLIBC_JUMPS.contains(&name);
            if name == CANCELLER && symbol.is_global() {
                let start = module.bias.to_runtime(crate::addr::VirtAddr(symbol.address())).0;
                canceller = Some(start..start.wrapping_add(symbol.size()));
            }
            let Some((name, hook)) = hook_of(name) else { continue };
            // A program's own static `fork`, `clone` or `longjmp` is none of the C library's.
            if (hook.starts_thread() || hook == Hook::Jump) && symbol.is_local() {
                continue;
            }
            let Some(offset) = crate::symbols::file_offset(&segments, crate::addr::VirtAddr(symbol.address())) else {
                continue;
            };
            let duplicate = sites.iter().any(|s| s.target.module == module.path && s.target.address == symbol.address());
            if !duplicate {
                let target = Target {
                    module: module.path.clone(),
                    open_path: module.open_path.clone(),
                    address: symbol.address(),
                    offset: offset.0,
                    size: symbol.size(),
                    site: Site::Entry,
                    cold: Vec::new(),
                    return_replaceable: true,
                    entered_inside: Vec::new(),
                    padding: 0,
                    padding_before: 0,
                    compiled: false,
                };
                sites.push(HookSite { name, hook, target });
            }
        }
        // The one whose call the link's hook tells: the link's library's.
        if sites.iter().any(|s| s.hook == Hook::UnwinderLink && s.target.module == module.path) {
            hooks.canceller = canceller;
        }
        // The runtime reads glibc's jmp_buf: jumps of another library (musl's,
        // a program's own `longjmp`) go unhooked.
        sites.retain(|s| s.hook != Hook::Jump || s.target.module != module.path || glibc);
    }
    hooks
}

/// Whether the module at `path` has glibc's link to libgcc_s's unwinder
/// ([`Hook::UnwinderLink`]), exported.
pub fn has_unwinder_link(path: &std::path::Path) -> bool {
    let Ok(image) = ElfImage::open(path) else { return false };
    let Ok(elf) = image.parse() else { return false };
    elf.dynamic_symbols().any(|s| !s.is_undefined() && s.kind() == SymbolKind::Text && s.name() == Ok(UNWINDER_LINK))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where this process (linked with the C library) starts threads and
    /// processes: the C library's exported entries.
    #[test]
    fn thread_and_process_starts_are_found_in_the_c_library() {
        let modules = crate::procfs::loaded_modules(std::process::id() as i32).expect("this process's modules");
        let starts: Vec<&str> = find(&modules).sites.iter().filter(|s| s.hook.starts_thread()).map(|s| s.name).collect();
        for name in ["pthread_create", "clone", "fork"] {
            assert!(starts.contains(&name), "{name} not among {starts:?}");
        }
    }

    /// glibc's jumps are hooked, `longjmp` and its checked one, in the C
    /// library alone.
    #[test]
    fn the_c_librarys_jumps_are_hooked() {
        let modules = crate::procfs::loaded_modules(std::process::id() as i32).expect("this process's modules");
        let hooks = find(&modules);
        let jumps: Vec<&HookSite> = hooks.sites.iter().filter(|s| s.hook == Hook::Jump).collect();
        let libc =
            modules.iter().find(|m| m.contains(crate::addr::RuntimeAddr(libc::pthread_cancel as *const () as u64))).expect("the C library");
        assert!(jumps.iter().all(|s| s.target.module == libc.path), "{jumps:?}");
        let names: Vec<&str> = jumps.iter().map(|s| s.name).collect();
        assert!(
            names.contains(&GLIBC_CHECKED_JUMP) && names.iter().any(|n| n.ends_with("longjmp") && *n != GLIBC_CHECKED_JUMP),
            "{names:?}"
        );
    }

    /// A C library that links libgcc_s's unwinder on demand (glibc 2.34
    /// and later) has the link hooked and pthread_cancel's code known,
    /// inside the library's code.
    #[test]
    fn the_c_librarys_link_to_the_unwinder_is_hooked_and_the_canceller_known() {
        let modules = crate::procfs::loaded_modules(std::process::id() as i32).expect("this process's modules");
        let hooks = find(&modules);
        let link = hooks.sites.iter().find(|s| s.hook == Hook::UnwinderLink);
        let libc = modules.iter().find(|m| has_unwinder_link(&m.open_path));
        assert_eq!(link.map(|l| &l.target.module), libc.map(|m| &m.path));
        if let Some(libc) = libc {
            let canceller = hooks.canceller.expect("pthread_cancel's code");
            let inside = |a: u64| libc.contains(crate::addr::RuntimeAddr(a));
            assert!(canceller.start < canceller.end && inside(canceller.start) && inside(canceller.end - 1), "{canceller:x?}");
            assert_eq!(canceller.start, libc::pthread_cancel as *const () as u64);
        }
    }
}
