//! Every source's events merged into one stream in time order.
//!
//! A thread that migrates writes its entry into one CPU's buffer and its
//! return into another's, and the in-process engine's records come by a
//! path of their own, so events are sorted by timestamp. An event is handed
//! on only when it is older than a watermark taken before the sources were
//! drained: anything older is in some buffer already, since the kernel
//! writes a record right after stamping it.

use crate::events::Event;

/// How far behind "now" events must be before they are ordered and released.
pub const ORDERING_MARGIN_NS: u64 = 20_000_000;

/// Events waiting to be handed on in time order.
#[derive(Default)]
pub struct EventQueue {
    pending: Vec<Event>,
}

impl EventQueue {
    /// Where sources put what they drain.
    pub fn pending(&mut self) -> &mut Vec<Event> {
        &mut self.pending
    }

    /// Puts an event of proftap's own into the stream.
    pub fn push(&mut self, event: Event) {
        self.pending.push(event);
    }

    /// Hands every pending event older than `watermark` to `sink`, in time
    /// order; `None` hands on everything (the recording is over).
    pub fn release(&mut self, watermark: Option<u64>, mut sink: impl FnMut(Event)) -> usize {
        // Stable: events of one buffer with equal stamps keep their order.
        self.pending.sort_by_key(Event::time);
        let ready = match watermark {
            Some(w) => self.pending.partition_point(|e| e.time() < w),
            None => self.pending.len(),
        };
        for event in self.pending.drain(..ready) {
            sink(event);
        }
        ready
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_time_order_up_to_the_watermark() {
        let exit = |time: u64| Event::Exit { time, pid: 1, tid: 1 };
        let mut queue = EventQueue::default();
        queue.pending().extend([exit(30), exit(10)]);
        queue.push(exit(20));
        let mut out = Vec::new();
        assert_eq!(queue.release(Some(25), |e| out.push(e.time())), 2);
        assert_eq!(queue.release(None, |e| out.push(e.time())), 1);
        assert_eq!(out, vec![10, 20, 30]);
    }
}
