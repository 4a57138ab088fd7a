//! The fill: one thread follows the reads of the cache's own plan and
//! reads, through one [`ReadSession`], the records some job needs into the
//! shared memory (DESIGN.md §9).
//!
//! The reader follows the reads of the cache's own plan (`brand_plan`, the
//! policy, seed and run length it is configured with, over its memory),
//! epoch after epoch: Brand's fill of the abstract memory, records of many
//! chunks at Brand's fill rates. Of each planned read it reads the records
//! some job needs that are not in memory, and skips the rest; a plan epoch
//! covers every sample once, so a job's epoch is one turn of the fill from
//! wherever it joined.

use std::time::Duration;

use crate::cursor::Fill;
use crate::shared::{Shared, lock};
use brand_io::ReadSession;

pub(crate) fn read_loop(sh: &Shared, mut session: ReadSession<()>, mut fill: Fill, depth: usize, readahead: u64) {
    let index = &sh.ds.index;
    loop {
        {
            let mut s = lock(&sh.state);
            if s.stopping.is_some() {
                break;
            }
            while s.failed.is_none() && session.in_flight() < depth && session.in_flight_read_bytes() < readahead {
                let Some((chunk, lacking)) = s.choose(index, &mut fill) else {
                    break;
                };
                let force = s.any_waiting() && session.in_flight() == 0;
                let Some(mask) = s.room_for(index, chunk, lacking, force) else {
                    break;
                };
                s.reading(index, chunk, mask);
                if mask == lacking {
                    fill.advance();
                }
                s.report.reads_issued += 1;
                for ext in session.extents(chunk, mask) {
                    if let Err(e) = session.submit(ext, ()) {
                        s.failed = Some(format!("the cache's reads failed: {e}"));
                        break;
                    }
                }
            }
            if session.in_flight() == 0 {
                let _ = sh.changed.wait_timeout(s, Duration::from_millis(100));
                continue;
            }
        }
        match session.recv() {
            Ok(((), c)) => {
                let mut s = lock(&sh.state);
                s.accept(index, &sh.memory, c);
            }
            Err(e) => {
                lock(&sh.state).failed = Some(format!("the cache's reads failed: {e}"));
            }
        }
        sh.changed.notify_all();
    }
    let _ = session.drain();
}
