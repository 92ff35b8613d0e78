//! `lathe dense-recall` (hidden; run by `lathe-bench` after its server stopped): recall@10 of a
//! collection's dense index against exact search over its stored section vectors, for queries
//! embedded with the static embedder, optionally beside one hnsw graph built over all of them.
//! It opens the index in this process, read-only in effect (nothing is written), so it lives in
//! the server crate; the benchmark tools reach it only as a command.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::dense::{query_elements, to_stored, StoredElement, UnitDotDistance};
use crate::embed::{dot, l2_normalize, Embedder, StaticEmbedder};
use crate::index::{CollectionIndex, DenseIndexConfig};
use crate::types::Filter;

/// The command line of `lathe dense-recall`.
#[derive(clap::Args, Debug)]
pub struct DenseRecallArgs {
    /// The collection's `index` folder (of a stopped server).
    #[arg(long)]
    pub index: PathBuf,
    /// Models folder (the static vectors embed the queries).
    #[arg(long, default_value = "./models")]
    pub models_dir: PathBuf,
    /// The queries, one a line.
    #[arg(long)]
    pub queries: PathBuf,
    /// The dense search's candidate list (`dense.ef_search`); default: the server's default.
    #[arg(long)]
    pub ef_search: Option<usize>,
    /// Also measure one hnsw graph built over all the stored vectors with the index's graph
    /// parameters: tells the data's difficulty apart from what segmenting costs.
    #[arg(long)]
    pub one_graph: bool,
    /// M (`max_nb_connection`) of that one graph; default: the index's.
    #[arg(long)]
    pub one_graph_m: Option<usize>,
    /// `ef_construction` of that one graph; default: the index's.
    #[arg(long)]
    pub one_graph_ef_construction: Option<usize>,
    /// Level scale of that one graph (hnsw_rs's `modify_level_scale`, 0.2 to 1.0).
    #[arg(long)]
    pub one_graph_level_scale: Option<f64>,
    /// Candidate lists (`ef`) that one graph is searched with; default: the index's `ef_search`.
    #[arg(long, value_delimiter = ',')]
    pub one_graph_ef: Vec<usize>,
    /// Search that one graph through hnsw_rs's filtered search (accepting every slot), as the
    /// index searches a segment.
    #[arg(long)]
    pub one_graph_filtered: bool,
}

/// Runs `lathe dense-recall`: the segmented index's mean recall@10 is the one line on stdout;
/// the details go to stderr.
pub fn run(args: DenseRecallArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&args.queries)
        .with_context(|| format!("reading {}", args.queries.display()))?;
    let queries: Vec<String> = text
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(str::to_string)
        .collect();
    let one_graph = args.one_graph.then(|| OneGraph {
        m: args.one_graph_m,
        ef_construction: args.one_graph_ef_construction,
        level_scale: args.one_graph_level_scale,
        efs: args.one_graph_ef.clone(),
        filtered: args.one_graph_filtered,
    });
    let recall = dense_recall_at_10(
        &args.index,
        &args.models_dir,
        &queries,
        args.ef_search,
        one_graph,
    )?;
    println!("{recall:.6}");
    Ok(())
}

/// The stored section vectors, normalised, each with its section key.
type UnitVectors = Vec<(u64, Vec<f32>)>;

/// Recalls of one searcher and the seconds it spent searching.
#[derive(Clone, Default)]
struct Run {
    recalls: Vec<f64>,
    seconds: f64,
}

impl Run {
    fn mean(&self) -> f64 {
        self.recalls.iter().sum::<f64>() / self.recalls.len().max(1) as f64
    }
}

/// The one graph, its settings, its build time in seconds, and its parameters.
type BuiltGraph = (
    hnsw_rs::hnsw::Hnsw<'static, StoredElement, UnitDotDistance>,
    DenseIndexConfig,
    f64,
    OneGraph,
);

/// Recall@10 of the collection's dense index at `index_path` against exact search over the
/// stored section vectors, for `queries` embedded with the static embedder.
pub fn dense_recall_at_10(
    index_path: &Path,
    models_dir: &Path,
    queries: &[String],
    ef_search: Option<usize>,
    one_graph: Option<OneGraph>,
) -> anyhow::Result<f64> {
    let embedder = StaticEmbedder::from_models_dir(models_dir).context("loading static vectors")?;
    let mut dense = DenseIndexConfig::new(embedder.dim());
    if let Some(ef_search) = ef_search {
        dense.ef_search = ef_search;
    }
    let index = CollectionIndex::open_or_create_with(
        index_path,
        16_000_000,
        Duration::from_secs(3600),
        Some(dense.clone()),
    )
    .context("opening the collection's index")?;
    let unit: UnitVectors = index
        .stored_section_vectors()?
        .into_iter()
        .map(|(key, mut vector)| {
            l2_normalize(&mut vector);
            (key, vector)
        })
        .collect();
    let texts: Vec<&str> = queries.iter().map(String::as_str).collect();
    let query_vectors = embedder
        .embed_texts(&texts)
        .context("embedding the queries")?;
    let one_graph = one_graph.map(|params| build_one_graph(&unit, &dense, params));
    let mut index_run = Run::default();
    let mut graph_runs = vec![Run::default(); one_graph.as_ref().map_or(0, |g| g.3.efs.len())];
    let snapshot = index.snapshot();
    for query in query_vectors.iter_rows() {
        if query.iter().all(|x| *x == 0.0) {
            continue;
        }
        let exact = exact_top(&unit, query, 10);
        let started = Instant::now();
        let approximate: Vec<u64> = index
            .search_dense(&snapshot, query, &Filter::default(), 10)?
            .iter()
            .map(|hit| hit.section_key)
            .collect();
        index_run.seconds += started.elapsed().as_secs_f64();
        index_run
            .recalls
            .push(recall_with_ties(&exact, &approximate, &unit, query));
        if let Some(graph) = &one_graph {
            search_one_graph(graph, &unit, query, &exact, &mut graph_runs);
        }
    }
    index.shutdown();
    if index_run.recalls.is_empty() {
        anyhow::bail!("no query had a non-zero static vector");
    }
    report(
        &index_run,
        dense.ef_search,
        one_graph.as_ref(),
        &graph_runs,
        unit.len(),
    );
    Ok(index_run.mean())
}

/// Builds the one graph over `unit` with `params` applied to the index's settings.
fn build_one_graph(
    unit: &UnitVectors,
    dense: &DenseIndexConfig,
    mut params: OneGraph,
) -> BuiltGraph {
    let config = params.applied_to(dense);
    let started = Instant::now();
    let graph = one_graph_over(unit, &config, params.level_scale);
    if params.efs.is_empty() {
        params.efs.push(dense.ef_search);
    }
    (graph, config, started.elapsed().as_secs_f64(), params)
}

/// Searches the one graph for `query` at each of its `ef`s, adding to `runs`.
fn search_one_graph(
    (graph, _, _, params): &BuiltGraph,
    unit: &UnitVectors,
    query: &[f32],
    exact: &[(u64, f32)],
    runs: &mut [Run],
) {
    let mut normalized = query.to_vec();
    l2_normalize(&mut normalized);
    let elements = query_elements(&normalized);
    let accept_all = |_: &usize| true;
    for (&ef, run) in params.efs.iter().zip(runs) {
        let started = Instant::now();
        let found: Vec<u64> = graph
            .search_filter(
                elements,
                10,
                ef.max(10),
                params.filtered.then_some(&accept_all as _),
            )
            .iter()
            .map(|neighbour| unit[neighbour.d_id].0)
            .collect();
        run.seconds += started.elapsed().as_secs_f64();
        run.recalls
            .push(recall_with_ties(exact, &found, unit, query));
    }
}

/// The recall lines on stderr.
fn report(
    index_run: &Run,
    ef_search: usize,
    one_graph: Option<&BuiltGraph>,
    graph_runs: &[Run],
    vectors: usize,
) {
    let queries = index_run.recalls.len();
    let per_query_ms = |seconds: f64| 1e3 * seconds / queries as f64;
    eprintln!(
        "recall@10 over {queries} queries: segmented index {:.3} ({:.2} ms a query with its sections read, ef {ef_search})",
        index_run.mean(),
        per_query_ms(index_run.seconds),
    );
    let Some((_, config, build_seconds, params)) = one_graph else {
        return;
    };
    for (ef, run) in params.efs.iter().zip(graph_runs) {
        eprintln!(
            "  one graph over the same {vectors} vectors: {:.3} ({:.2} ms a query; M {}, ef_construction {}, ef {}, {}; built in {build_seconds:.1} s)",
            run.mean(),
            per_query_ms(run.seconds),
            config.max_nb_connection,
            config.ef_construction,
            ef.max(&10),
            if params.filtered {
                "filtered search"
            } else {
                "plain search"
            },
        );
    }
}

/// The graph parameters of `--one-graph` (unset: the index's).
pub struct OneGraph {
    m: Option<usize>,
    ef_construction: Option<usize>,
    level_scale: Option<f64>,
    efs: Vec<usize>,
    filtered: bool,
}

impl OneGraph {
    /// `index`'s settings with these parameters where they are set.
    fn applied_to(&self, index: &DenseIndexConfig) -> DenseIndexConfig {
        DenseIndexConfig {
            max_nb_connection: self.m.unwrap_or(index.max_nb_connection),
            ef_construction: self.ef_construction.unwrap_or(index.ef_construction),
            ..index.clone()
        }
    }
}

/// One hnsw graph over all of `vectors` (slot = position), built as the index builds a merged
/// segment: the index's graph parameters and stored form (int8 codes), batches of 10,000
/// inserted in parallel.
fn one_graph_over(
    vectors: &[(u64, Vec<f32>)],
    dense: &DenseIndexConfig,
    level_scale: Option<f64>,
) -> hnsw_rs::hnsw::Hnsw<'static, StoredElement, UnitDotDistance> {
    let mut graph = hnsw_rs::hnsw::Hnsw::new(
        dense.max_nb_connection,
        vectors.len().max(1),
        dense.max_layer,
        dense.ef_construction,
        UnitDotDistance,
    );
    if let Some(scale) = level_scale {
        graph.modify_level_scale(scale);
    }
    let stored: Vec<Vec<StoredElement>> = vectors
        .iter()
        .map(|(_, vector)| to_stored(vector))
        .collect();
    let slots: Vec<(&[StoredElement], usize)> = stored
        .iter()
        .enumerate()
        .map(|(slot, vector)| (vector.as_slice(), slot))
        .collect();
    for batch in slots.chunks(10_000) {
        graph.parallel_insert_slice(&batch.to_vec());
    }
    graph
}

/// The `k` keys of `vectors` most similar to `query` (dot product of unit vectors), best first,
/// with their similarities.
fn exact_top(vectors: &[(u64, Vec<f32>)], query: &[f32], k: usize) -> Vec<(u64, f32)> {
    let mut scored: Vec<(u64, f32)> = vectors
        .iter()
        .map(|(key, vector)| (*key, dot(vector, query)))
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    scored.truncate(k);
    scored
}

/// Share of the exact top-k the approximate answer found. A returned key outside the exact list
/// still counts when it ties the exact k-th similarity (within 1e-6): near-duplicate copies of a
/// section may tie, and either is a right answer.
fn recall_with_ties(
    exact: &[(u64, f32)],
    approximate: &[u64],
    vectors: &[(u64, Vec<f32>)],
    query: &[f32],
) -> f64 {
    if exact.is_empty() {
        return 1.0;
    }
    let kth = exact.last().map_or(f32::NEG_INFINITY, |(_, s)| *s);
    let similarity = |key: u64| {
        vectors
            .iter()
            .find(|(candidate, _)| *candidate == key)
            .map(|(_, vector)| dot(vector, query))
    };
    let found = approximate
        .iter()
        .take(exact.len())
        .filter(|key| {
            exact.iter().any(|(exact_key, _)| exact_key == *key)
                || similarity(**key).is_some_and(|s| s >= kth - 1e-6)
        })
        .count();
    found as f64 / exact.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_counts_exact_hits_and_ties_of_the_kth_similarity() {
        let vectors = vec![
            (1, vec![1.0, 0.0]),
            (2, vec![0.8, 0.6]),
            (3, vec![0.8, 0.6]),
            (4, vec![0.0, 1.0]),
        ];
        let query = [1.0, 0.0];
        let exact = exact_top(&vectors, &query, 2);
        assert_eq!(exact.iter().map(|(k, _)| *k).collect::<Vec<_>>(), [1, 2]);
        assert_eq!(recall_with_ties(&exact, &[1, 2], &vectors, &query), 1.0);
        // Key 3 ties key 2 exactly: as right an answer.
        assert_eq!(recall_with_ties(&exact, &[1, 3], &vectors, &query), 1.0);
        assert_eq!(recall_with_ties(&exact, &[1, 4], &vectors, &query), 0.5);
        assert_eq!(recall_with_ties(&exact, &[], &vectors, &query), 0.0);
    }

    #[test]
    fn one_graph_over_the_vectors_finds_nearly_each_of_them_first() {
        // 200 unit vectors on a circle: each is its own nearest neighbour. What is checked is
        // which slot each key went to (a wrong wiring finds almost none first), not hnsw_rs's
        // walk: it builds on several threads, and a ring of 2-d points is its worst case, so a
        // point is now and then left unreachable or found after a neighbour its int8 rounding
        // ties with (one missed in CI).
        let vectors: Vec<(u64, Vec<f32>)> = (0..200)
            .map(|i| {
                let angle = i as f32 * std::f32::consts::TAU / 200.0;
                (1000 + i as u64, vec![angle.cos(), angle.sin()])
            })
            .collect();
        let graph = one_graph_over(&vectors, &DenseIndexConfig::new(2), None);
        let found_first = vectors
            .iter()
            .enumerate()
            .filter(|(slot, (_, vector))| {
                graph.search(query_elements(vector), 1, 64)[0].d_id == *slot
            })
            .count();
        assert!(found_first >= 196, "{found_first} of 200 found first");
    }
}
