//! A hello answer lost on the way back (the consumer accepted the stream,
//! the owner never heard so and connects again, as through a relay whose
//! connection breaks): the abandoned stream's end is neither the owner's
//! goodbye nor its loss, and the retry is accepted. Its own test binary: the
//! fault hook applies to every node of the process.

use std::sync::Arc;

use brand_format::Dataset;
use brand_import::synthetic::small_dataset;
use brand_loader::LoaderState;
use brand_nodes::NodeLoader;

mod common;
use common::{addresses, node_config, run_ranks_serving_their_plans, serve_epochs};

#[test]
fn every_first_hello_answer_lost_still_serves_every_plan() {
    brand_nodes::lose_first_hello_answers();
    let t = tempfile::tempdir().expect("tempdir");
    let ds = Arc::new(Dataset::open(small_dataset(t.path(), 600).expect("pack")).expect("open"));
    for world in [2usize, 3] {
        let nodes = addresses(world);
        let cfgs: Vec<_> = (0..world as u32)
            .map(|r| node_config(&nodes, r, "lost-answer"))
            .collect();
        let d = ds.clone();
        run_ranks_serving_their_plans(&cfgs, &ds, 600, move |_, cfg, _| {
            let mut l = NodeLoader::open(d.clone(), &cfg.loader, &cfg.nodes, LoaderState::default())
                .map_err(|e| e.to_string())?;
            let served = serve_epochs(&mut l, 2)?;
            Ok((served, l.close()))
        });
    }
}
