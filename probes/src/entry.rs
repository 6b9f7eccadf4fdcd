//! How the kernel handles the first instruction of a probed function: the
//! cost class of a uprobe there.

/// How the kernel handles the instruction a uprobe replaces: some it
/// emulates in the trap, the rest it single-steps out of line, which costs
/// several times more.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    /// push, call, jmp, jcc, nop: emulated.
    Emulated,
    /// Anything else: single-stepped.
    Stepped,
}

/// Whether the kernel refuses a uprobe on the instruction `code` starts
/// with, as its x86 uprobes do (`uprobe_init_insn`): one with a lock prefix
/// or an ES, CS, SS or DS segment prefix (a barrier's `lock or`, a
/// `notrack` jump), and the commonest of the opcodes it will not run out
/// of line (AVX-512's EVEX, `int3`, `int`, `hlt`, `syscall`, `ud2`, the
/// fences and `rdtscp`). Placed before the program starts, such a probe is
/// skipped without a word; placed in a running program, it fails.
pub fn uprobe_refuses(code: &[u8]) -> bool {
    // The legacy prefixes, in any order before the opcode.
    const LOCK: u8 = 0xf0;
    const REFUSED: [u8; 5] = [LOCK, 0x26, 0x2e, 0x36, 0x3e];
    const OTHERS: [u8; 6] = [0xf2, 0xf3, 0x64, 0x65, 0x66, 0x67];
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let prefixes = code.iter().take_while(|b| REFUSED.contains(b) || OTHERS.contains(b)).count();
    if code[..prefixes].iter().any(|b| REFUSED.contains(b)) {
        return true;
    }
    let rest = match &code[prefixes..] {
        [0x40..=0x4f, tail @ ..] => tail, // REX
        rest => rest,
    };
    matches!(
        rest,
        // EVEX, int3, int N, hlt
        [0x62 | 0xcc | 0xcd | 0xf4, ..]
        // rdtscp, xgetbv and the rest of 0f 01; syscall; ud2; the fences, ldmxcsr, xsave and the rest of 0f ae
            | [0x0f, 0x01 | 0x05 | 0x0b | 0xae, ..]
    )
}

/// Whether the return address of a call to `name` must be left as it is,
/// neither replaced by a trampoline nor probed on return:
/// - functions entered with something else on top of the stack: a
///   program's entry point (its argument count), the return from a signal
///   handler into `rt_sigreturn` (the signal frame), the dynamic linker's
///   lazy binding and TLS descriptor resolvers (the words the PLT
///   pushed), split-stack growth;
/// - functions that return twice (`setjmp`, `getcontext`, `vfork`), whose
///   second return would find the trampoline's frame gone;
/// - functions that read their own return address to know their caller
///   (`dlsym` with `RTLD_NEXT`, `dlopen`).
///
/// `name` as the symbol index gives it (`name #2` for a namesake).
pub fn return_address_untouchable(name: &str) -> bool {
    const EXACT: &[&str] = &[
        "_start",
        "__start",
        "_dl_start_user",
        "__restore_rt",
        "__morestack",
        "setjmp",
        "_setjmp",
        "__sigsetjmp",
        "sigsetjmp",
        "getcontext",
        "swapcontext",
        "savectx",
        "vfork",
        "__vfork",
        "dlsym",
        "dlvsym",
        "dlopen",
        "dlmopen",
    ];
    const PREFIXES: &[&str] = &["_dl_runtime_resolve", "_dl_runtime_profile", "_dl_tlsdesc_"];
    let name = name.split_once(" #").map_or(name, |(plain, _)| plain);
    EXACT.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Classifies the first instruction of a function (x86-64 encodings; other
/// architectures count as stepped).
pub fn classify_entry(code: &[u8]) -> EntryKind {
    if !cfg!(target_arch = "x86_64") {
        return EntryKind::Stepped;
    }
    let emulated = match code {
        [0x50..=0x57, ..] => true,                           // push r64
        [0x41, 0x50..=0x57, ..] => true,                     // push r8-r15
        [0x90, ..] | [0x66, 0x90, ..] => true,               // nop
        [0x0f, 0x1f, ..] | [0x66, 0x0f, 0x1f, ..] => true,   // nopl / nopw
        [0xe8, ..] | [0xe9, ..] | [0xeb, ..] => true,        // call / jmp
        [0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] => true, // jcc
        _ => false,
    };
    if emulated { EntryKind::Emulated } else { EntryKind::Stepped }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn entries_are_classified_by_first_instruction() {
        assert_eq!(classify_entry(&[0x55, 0x48, 0x89, 0xe5]), EntryKind::Emulated); // push %rbp
        assert_eq!(classify_entry(&[0x41, 0x57]), EntryKind::Emulated); // push %r15
        assert_eq!(classify_entry(&[0xe9, 0, 0, 0, 0]), EntryKind::Emulated); // jmp
        assert_eq!(classify_entry(&[0x48, 0x8d, 0x04, 0x3f]), EntryKind::Stepped); // lea
        assert_eq!(classify_entry(&[0x48, 0x83, 0xec, 0x08]), EntryKind::Stepped); // sub $8,%rsp
        assert_eq!(classify_entry(&[]), EntryKind::Stepped);
    }

    #[test]
    fn the_kernel_refuses_lock_and_segment_prefixed_instructions() {
        assert!(uprobe_refuses(&[0xf0, 0x48, 0x83, 0x0c, 0x24, 0x00])); // lock orq $0,(%rsp)
        assert!(uprobe_refuses(&[0x2e, 0x90])); // cs nop
        assert!(uprobe_refuses(&[0x66, 0x3e, 0xff, 0xe0])); // notrack jmp, after an operand-size prefix
        assert!(!uprobe_refuses(&[0x64, 0x48, 0x8b, 0x04, 0x25, 0x28, 0, 0, 0])); // mov %fs:0x28,%rax
        assert!(!uprobe_refuses(&[0xf3, 0x0f, 0x1e, 0xfa])); // endbr64
        assert!(!uprobe_refuses(&[0x55, 0xf0])); // push %rbp: a byte after the opcode is not a prefix
        assert!(!uprobe_refuses(&[]));
        assert!(uprobe_refuses(&[0x0f, 0xae, 0xf0])); // mfence
        assert!(uprobe_refuses(&[0x0f, 0x01, 0xf9])); // rdtscp
        assert!(uprobe_refuses(&[0x62, 0xf1, 0x7d, 0x48, 0x6f, 0x06])); // vmovdqa32 (EVEX)
        assert!(!uprobe_refuses(&[0x48, 0x0f, 0xaf, 0xc1])); // imul %rcx,%rax
        assert!(!uprobe_refuses(&[0xc5, 0xf9, 0x6f, 0x06])); // vmovdqa (VEX)
    }
}
