//! A target's stack as the detach reads it to know whether a signal
//! handler would return into proftap's code: any bytes, at any address
//! (the target writes its stack). The live signal frames found must lie
//! within the bytes read, on word boundaries, outermost (highest) first,
//! each returning to a restorer and naming the address its frame keeps.
//! Followed across stacks (every stack of the target holding these
//! bytes), each frame lies in a stack read, and the stacks read are few.
//!
//! The input: eight bytes of the stack's address (little-endian), then
//! the stack's bytes. A restorer is at 0x40_1000.

use proftap_probes::inject::patched::{live_signal_frames, signal_frames_across_stacks};

proftap_fuzz::target!(run);

const RESTORER: u64 = 0x40_1000;
/// Where a frame keeps the interrupted address.
const FRAME_RIP: usize = 176;

fn run(data: &[u8]) {
    let Some((base, stack)) = data.split_first_chunk::<8>() else { return };
    let base = u64::from_le_bytes(*base);
    let word = |at: usize| stack.get(at..at + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap_or_default()));
    let frames = live_signal_frames(stack, base, |ret| ret == RESTORER);
    for (i, frame) in frames.iter().enumerate() {
        let at = usize::try_from(frame.at.wrapping_sub(base)).unwrap_or(usize::MAX);
        assert!(frame.at >= base && at < stack.len() && at % 8 == 0, "{frame:?} at {base:#x}");
        assert_eq!(word(at), Some(RESTORER), "{frame:?}");
        assert_eq!(word(at + FRAME_RIP), Some(frame.interrupted_ip), "{frame:?}");
        assert!(i == 0 || frames[i - 1].at > frame.at, "{frames:?}");
    }
    let mut read_from = Vec::new();
    let read = |from: u64| {
        read_from.push(from);
        Some(stack.to_vec())
    };
    let Some(across) = signal_frames_across_stacks(base.wrapping_add(8), read, |ret| ret == RESTORER) else { return };
    assert!(read_from.len() <= 8, "{read_from:?}");
    for frame in &across {
        let within =
            |from: &u64| frame.at.checked_sub(*from).and_then(|at| usize::try_from(at).ok()).filter(|&at| word(at) == Some(RESTORER));
        assert!(read_from.iter().any(|from| within(from).is_some()), "{frame:?} in none of {read_from:?}");
    }
}
