//! Builds proftap's runtime (runtime/runtime.c), the code that runs inside
//! a patched process, into a flat position-independent image, and tells
//! the crate where its entry points are.

use object::{Object, ObjectSection, ObjectSymbol};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The runtime's functions and data that proftap needs the offset of.
const SYMBOLS: &[&str] = &[
    "proftap_lock_counters",
    "proftap_clone",
    "proftap_entry",
    "proftap_exit",
    "proftap_unhook",
    "proftap_unwinder_link",
    "proftap_rehook",
    "proftap_resume",
    "proftap_jump",
    "proftap_region",
    "proftap_config",
    "proftap_layout",
    "proftap_fork_code",
    "proftap_fork_code_end",
];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dir = Path::new("runtime");
    for file in ["runtime.c", "runtime.h", "runtime.ld"] {
        println!("cargo:rerun-if-changed=runtime/{file}");
    }
    println!("cargo:rerun-if-env-changed=CC");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let object_file = out.join("runtime.o");
    let image = out.join("runtime.elf");
    // Freestanding: no C library, no SSE registers (trampolines save the
    // general ones only), no stack protector, nothing to relocate.
    run(Command::new(&cc)
        .args(["-O2", "-std=gnu11", "-ffreestanding", "-fno-builtin", "-nostdlib", "-fPIC", "-fvisibility=hidden"])
        .args(["-mgeneral-regs-only", "-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-fcf-protection=none"])
        .args(["-fno-jump-tables", "-Wall", "-Wextra", "-Werror", "-c"])
        .arg(dir.join("runtime.c"))
        .arg("-o")
        .arg(&object_file));
    run(Command::new(&cc)
        .args(["-nostdlib", "-static", "-Wl,--no-dynamic-linker", "-Wl,--build-id=none", "-Wl,-T"])
        .arg(dir.join("runtime.ld"))
        .arg(&object_file)
        .arg("-o")
        .arg(&image));
    let bytes = std::fs::read(&image).expect("read the runtime's image");
    let elf = object::File::parse(&*bytes).expect("parse the runtime's image");
    let mut flat = Vec::new();
    for section in elf.sections().filter(|s| {
        s.size() > 0
            && matches!(
                s.kind(),
                object::SectionKind::Text
                    | object::SectionKind::ReadOnlyData
                    | object::SectionKind::Data
                    | object::SectionKind::UninitializedData
                    | object::SectionKind::ReadOnlyString
            )
    }) {
        let end = (section.address() + section.size()) as usize;
        if flat.len() < end {
            flat.resize(end, 0);
        }
        if let Ok(data) = section.data() {
            let start = section.address() as usize;
            flat[start..start + data.len()].copy_from_slice(data);
        }
    }
    std::fs::write(out.join("runtime.bin"), &flat).expect("write the runtime");
    let mut consts = String::new();
    for name in SYMBOLS {
        let symbol = elf.symbols().find(|s| s.name() == Ok(name)).unwrap_or_else(|| panic!("the runtime has no {name}"));
        consts.push_str(&format!(
            "/// Offset of `{name}` in the runtime.\npub const {}: u64 = {:#x};\n",
            name.to_uppercase(),
            symbol.address()
        ));
    }
    std::fs::write(out.join("runtime_symbols.rs"), consts).expect("write the runtime's symbols");
}

fn run(command: &mut Command) {
    let status =
        command.status().unwrap_or_else(|e| panic!("cannot run {command:?} to build proftap's runtime: {e}; a C compiler is needed"));
    assert!(status.success(), "{command:?} failed building proftap's runtime");
}
