//! Edge counting on any bytes as a function's code and its binary's data:
//! the graph (jump tables read from the data), counter placement, patch
//! sites, stubs, counts from hostile counter values and line counts from
//! them, as `run --lines` does with every function of a program it is
//! given (the binary, and the counters in the target's memory, are the
//! user's to write); and the same counts with threads found anywhere in the
//! code when counting started or ended (`attach --lines`: where the
//! target's threads stand is the target's to choose); and the hooks of
//! regions over those lines, beside the counters (`run --region`).
//!
//! The input: a byte of choices, the code's length (2 bytes, little
//! endian), the code (at 0x1000), then the data (at 0x2000), whose first
//! bytes also give the counters' values.

use proftap_probes::arcs::{
    Cfg, CodeRange, Data, Frame, FunctionCode, FunctionLines, add_region_hooks, counter_costs, line_branches, line_entries, place_counters,
    plan_sites, region_hooks, solve_counters, solve_with_frames, stub, stub_with_hooks, unsettled,
};

proftap_fuzz::target!(run);

const CODE: u64 = 0x1000;
const DATA: u64 = 0x2000;

fn run(input: &[u8]) {
    let [choices, lo, hi, rest @ ..] = input else { return };
    let len = usize::from(u16::from_le_bytes([*lo, *hi])).min(rest.len());
    let (code, data) = rest.split_at(len);
    let read = |address: u64, n: usize| {
        let offset = usize::try_from(address.checked_sub(DATA)?).ok()?;
        data.get(offset..offset.checked_add(n)?).map(<[u8]>::to_vec)
    };
    let reader = Data { read: &read, bias: u64::from(choices >> 4) << 12 };
    let parts = [CodeRange { address: CODE, bytes: code }];
    let Ok(cfg) = Cfg::build_reading(&parts, Some(&reader)) else { return };
    let Ok(mut function) = FunctionCode::new(&cfg, &parts) else { return };
    if choices & 1 != 0 {
        function.let_calls_return_to_stubs();
    }
    if choices & 4 != 0 {
        function.reserve(CODE..CODE + 5);
    }
    let placement = place_counters(&cfg, &counter_costs(&cfg, &function));
    let mut sites = plan_sites(&cfg, &function, &placement).unwrap_or_default();
    // Locked from the start, or a `nop` where the lock goes.
    sites.iter_mut().flat_map(|s| &mut s.counters).for_each(|c| c.atomic = choices & 2 == 0);
    let counters: Vec<u64> = (0..placement.counted().len() as u64).map(|i| 0x20_0000 + 8 * i).collect();
    for site in &sites {
        let _ = site.jump_to(0x10_0000);
        let _ = stub(site, 0x10_0000, &counters);
    }
    let values: Vec<u64> = placement
        .counted()
        .iter()
        .enumerate()
        .map(|(i, _)| data.get(i * 8..i * 8 + 8).map_or(i as u64, |b| u64::from_le_bytes(b.try_into().unwrap_or_default())))
        .collect();
    let Ok(counts) = solve_counters(&cfg, &placement, &values) else { return };
    // A row at each block's start and one inside it, on lines from the data.
    let line = |i: usize| u32::from(data.get(i).copied().unwrap_or(0) % 8);
    let rows = cfg
        .blocks()
        .iter()
        .enumerate()
        .flat_map(|(b, block)| [(block.start, vec![line(b)]), (block.start + 1, vec![line(b + 1), line(b + 2)])])
        .collect();
    let located = cfg.blocks().iter().enumerate().map(|(b, block)| (block.start, line(b))).collect();
    let lines = FunctionLines { entry_line: line(0), entry_also: vec![line(1)], decl_line: Some(9), rows, located };
    let _ = line_entries(&cfg, &counts, &lines);
    let _ = line_branches(&cfg, &counts, &lines);
    let _ = unsettled(&cfg, &lines);
    // Two regions over the lines, from the choices: hooks beside the counters.
    let regions_of: Vec<Vec<u32>> =
        (0..10u32).map(|l| (0..2u32).filter(|r| u32::from(*choices) >> (l % 4 + 4 * r) & 1 != 0).collect()).collect();
    if let Ok(hooks) = region_hooks(&cfg, &function, &lines, &regions_of) {
        let mut hooked = sites.clone();
        if add_region_hooks(&cfg, &function, &mut hooked, &hooks).is_ok() {
            for site in &hooked {
                let _ = stub_with_hooks(site, 0x10_0000, &counters, Some(0x10_8000));
            }
        }
    }
    // Threads at addresses from the data, inside the code or not, inside instructions or not.
    let frames: Vec<Frame> = data
        .chunks_exact(3)
        .take(8)
        .map(|c| Frame { pc: CODE.wrapping_add(u64::from(u16::from_le_bytes([c[0], c[1]]))) % (CODE + 0x1000), at_start: c[2] & 1 == 0 })
        .collect();
    if let Ok(counts) = solve_with_frames(&cfg, &placement, &sites, &values, &frames) {
        let _ = line_entries(&cfg, &counts, &lines);
    }
}
