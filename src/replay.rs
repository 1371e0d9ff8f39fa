//! `lidar-kernels replay`: every PointCloud2 of a bag through the configured pipeline, outputs
//! written to an MCAP bag with the input's stamps and frame ids.

use crate::bag::{self, BagError, McapBagWriter, TopicHandle};
use crate::cloud::POINTCLOUD2_TYPE;
use crate::pipeline::{Engine, FrameOutput, Pipeline, PipelineConfig, PipelineStats, BOXES_TOPIC};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Namespace of the output topics.
pub const OUTPUT_NAMESPACE: &str = "/lidar_kernels";

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Bag(#[from] BagError),
    #[error("{path}: no PointCloud2 topic in the bag (topics: {topics})")]
    NoCloudTopic { path: String, topics: String },
    #[error("{path}: several PointCloud2 topics ({topics}); choose one with --topic")]
    AmbiguousTopic { path: String, topics: String },
    #[error("--render: {0}")]
    Render(String),
}

/// What to replay and where to write.
#[derive(Debug, Clone)]
pub struct ReplayOptions {
    pub bag: PathBuf,
    pub topic: Option<String>,
    pub out: Option<PathBuf>,
    /// Print one line per frame.
    pub verbose_frames: bool,
    /// Write one bird's-eye PNG per frame here (the detect stage must be enabled).
    pub render: Option<PathBuf>,
}

/// Totals of a replay.
#[derive(Debug, Clone)]
pub struct ReplaySummary {
    pub topic: String,
    pub frames: u64,
    pub skipped: u64,
    pub box_frames: u64,
    pub stats: PipelineStats,
    pub out: Option<PathBuf>,
    /// The backend that ran ([`Engine::describe`]).
    pub backend: String,
}

struct OutputBag {
    writer: McapBagWriter,
    topics: BTreeMap<&'static str, TopicHandle>,
}

impl OutputBag {
    fn create(path: &Path) -> Result<Self, BagError> {
        let writer = if path.extension().is_some_and(|e| e == "mcap") {
            McapBagWriter::create(path)?
        } else {
            McapBagWriter::create_folder(path)?
        };
        Ok(Self { writer, topics: BTreeMap::new() })
    }

    fn write(&mut self, name: &'static str, type_name: &str, log_time_ns: u64, cdr: &[u8]) -> Result<(), BagError> {
        let handle = match self.topics.get(name) {
            Some(h) => *h,
            None => {
                let h = self.writer.add_topic(&format!("{OUTPUT_NAMESPACE}/{name}"), type_name)?;
                self.topics.insert(name, h);
                h
            }
        };
        self.writer.write(handle, log_time_ns, cdr)
    }
}

/// Picks the cloud topic: the one asked for, else the bag's only PointCloud2 topic that is not
/// the boxes topic.
fn cloud_topic(reader: &bag::BagReader, asked: Option<&str>, boxes_topic: Option<&str>) -> Result<String, ReplayError> {
    if let Some(t) = asked {
        reader.require_topic_type(t, POINTCLOUD2_TYPE)?;
        return Ok(t.to_string());
    }
    let path = reader.path().display().to_string();
    let clouds: Vec<&str> = reader
        .topics()
        .iter()
        .filter(|t| t.type_name == POINTCLOUD2_TYPE && Some(t.name.as_str()) != boxes_topic)
        .map(|t| t.name.as_str())
        .collect();
    match clouds.as_slice() {
        [one] => Ok(one.to_string()),
        [] => Err(ReplayError::NoCloudTopic {
            path,
            topics: reader
                .topics()
                .iter()
                .map(|t| format!("{} ({})", t.name, t.type_name))
                .collect::<Vec<_>>()
                .join(", "),
        }),
        many => Err(ReplayError::AmbiguousTopic { path, topics: many.join(", ") }),
    }
}

/// Prints above the progress bar, or plainly when the bar is hidden (not a terminal).
fn say(progress: &ProgressBar, line: String) {
    if progress.is_hidden() {
        println!("{line}");
    } else {
        progress.println(line);
    }
}

fn frame_line(index: u64, out: &FrameOutput) -> String {
    let (h, r) = (out.header(), &out.results);
    let mut line = format!("frame {index:>4} stamp {}.{:09} points {:>7}", h.stamp_sec, h.stamp_nanosec, r.points);
    if r.dropped_non_finite > 0 {
        line += &format!(" (non-finite dropped {})", r.dropped_non_finite);
    }
    if let Some(v) = &r.voxels {
        line += &format!(
            " | voxels {} (out of range {}, over capacity {})",
            v.len(),
            v.dropped_out_of_range(),
            v.dropped_capacity()
        );
    }
    if let Some(d) = r.downsampled {
        line += &format!(" | downsampled {d}");
    }
    if let Some(s) = r.valid_samples() {
        line += &format!(" | fps {}", s.len());
    }
    if let Some(n) = &r.neighborhoods {
        line += &format!(" | neighbours {}x{} ({} found)", n.rows, n.width, n.found);
    }
    line
}

/// Replays `opts.bag` through a pipeline built from `config` on `engine`.
pub fn replay(opts: &ReplayOptions, config: PipelineConfig, engine: Engine) -> Result<ReplaySummary, ReplayError> {
    let reader = bag::open(&opts.bag)?;
    let boxes_topic = config.nms.enabled.then(|| config.nms.boxes_topic.clone()).filter(|t| reader.topic(t).is_some());
    let topic = cloud_topic(&reader, opts.topic.as_deref(), boxes_topic.as_deref())?;
    let mut pipeline = Pipeline::with_engine(config, engine);
    let mut out = opts.out.as_deref().map(OutputBag::create).transpose()?;

    let total = reader.topic(&topic).map_or(0, |t| t.message_count);
    let progress = ProgressBar::new(total);
    progress.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} frames {msg}")
            .expect("static template"),
    );
    let (mut frames, mut skipped, mut box_frames, mut read) = (0u64, 0u64, 0u64, 0u64);
    let _span = tracing::info_span!("replay", bag = %opts.bag.display(), topic = %topic).entered();
    for item in reader.messages(None) {
        let msg = match item {
            Ok(m) => m,
            // Damage the reader reads around (a bad sqlite page, an unknown MCAP record): one
            // line, counted, and the messages after it still come.
            Err(e @ BagError::Skipped { .. }) => {
                say(&progress, format!("bag: {e}"));
                skipped += 1;
                continue;
            }
            Err(e) => {
                // A damaged bag ends the stream; what came before it has been processed.
                say(&progress, format!("bag read stopped: {e}"));
                skipped += 1;
                break;
            }
        };
        if boxes_topic.as_deref() == Some(msg.topic.as_str()) {
            match msg
                .expect_type(POINTCLOUD2_TYPE)
                .map_err(|e| e.to_string())
                .and_then(|b| pipeline.process_boxes_cdr(b).map_err(|e| e.to_string()))
            {
                Ok(kept) => {
                    let header = &kept.header;
                    box_frames += 1;
                    if opts.verbose_frames {
                        say(
                            &progress,
                            format!(
                                "boxes stamp {}.{:09} kept {} of {}",
                                header.stamp_sec,
                                header.stamp_nanosec,
                                kept.nms.keep.len(),
                                kept.nms.candidates
                            ),
                        );
                    }
                    if let Some(o) = out.as_mut() {
                        o.write(BOXES_TOPIC, POINTCLOUD2_TYPE, header.stamp_ns(), kept.message().cdr())?;
                    }
                }
                Err(e) => {
                    skipped += 1;
                    say(&progress, format!("skipped boxes message at {} ns: {e}", msg.log_time_ns));
                }
            }
            continue;
        }
        if msg.topic != topic {
            continue;
        }
        read += 1;
        progress.inc(1);
        let result = msg
            .expect_type(POINTCLOUD2_TYPE)
            .map_err(|e| e.to_string())
            .and_then(|bytes| pipeline.process_cdr(bytes).map_err(|e| e.to_string()));
        match result {
            Ok(frame) => {
                if opts.verbose_frames {
                    say(&progress, frame_line(frames, &frame));
                }
                if let (Some(dir), Some(d)) = (&opts.render, &frame.results.detections) {
                    let h = frame.header();
                    let scene = crate::render::Scene {
                        cloud: &frame.view.gather().cloud,
                        detections: d,
                        truth: &[],
                        lines: vec![
                            format!("{} {}.{:09}", h.frame_id, h.stamp_sec, h.stamp_nanosec),
                            crate::render::counts_line(d, frame.results.points),
                        ],
                    };
                    let path = dir.join(format!("frame_{frames:06}.png"));
                    std::fs::create_dir_all(dir)
                        .and_then(|_| crate::render::write_png(&scene, &path))
                        .map_err(|e| ReplayError::Render(format!("{}: {e}", path.display())))?;
                }
                if let Some(o) = out.as_mut() {
                    let stamp = frame.header().stamp_ns();
                    for (name, m) in frame.messages() {
                        o.write(name, POINTCLOUD2_TYPE, stamp, m.cdr())?;
                    }
                    for (name, type_name, cdr) in frame.typed_messages() {
                        o.write(name, type_name, stamp, &cdr)?;
                    }
                }
                frames += 1;
            }
            Err(e) => {
                skipped += 1;
                say(&progress, format!("skipped message at {} ns on {topic}: {e}", msg.log_time_ns));
            }
        }
    }
    progress.finish_and_clear();
    // What a damaged bag still gave, against what its metadata.yaml lists.
    let promised = reader.metadata().and_then(|m| {
        m.topics_with_message_count.iter().find(|t| t.topic_metadata.name == topic).map(|t| t.message_count)
    });
    if let Some(promised) = promised.filter(|&p| p != read) {
        say(&progress, format!("bag: read {read} of the {promised} messages on {topic} that metadata.yaml lists"));
    }
    let out_path = out.map(|o| o.writer.finish()).transpose()?;
    let backend = pipeline.engine.describe();
    Ok(ReplaySummary { topic, frames, skipped, box_frames, stats: pipeline.stats, out: out_path, backend })
}
