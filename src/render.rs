//! Bird's-eye-view pictures of the detect stage: points coloured by cluster (ground grey), the
//! kept boxes with their heading, ground truth where given, a scale bar, the frame's stamp and
//! counts. Drawing through embedded-graphics (lines, text in its built-in fonts), PNG through png.

use crate::cloud::Cloud;
use crate::ops::detect::{Detections, PointClass, CLASS_NAMES};
use crate::ops::nms::Box3d;
use embedded_graphics::mono_font::{ascii::FONT_10X20, ascii::FONT_9X15, MonoTextStyle};
use embedded_graphics::pixelcolor::Rgb888;
use embedded_graphics::prelude::*;
use embedded_graphics::primitives::{Line, PrimitiveStyle, Rectangle};
use embedded_graphics::text::Text;
use std::path::Path;

/// Side of the picture in pixels.
pub const SIZE: u32 = 1200;

const BACKGROUND: Rgb888 = Rgb888::new(18, 20, 28);
const GROUND: Rgb888 = Rgb888::new(80, 80, 86);
/// Object points in no kept cluster, and overhead points.
const UNCLUSTERED: Rgb888 = Rgb888::new(150, 150, 160);
const TRUTH: Rgb888 = Rgb888::new(40, 255, 110);
const TEXT: Rgb888 = Rgb888::new(235, 235, 235);
/// Box colours by class (car, pedestrian, cyclist, unknown).
const CLASS_COLOURS: [Rgb888; 4] =
    [Rgb888::new(255, 190, 0), Rgb888::new(255, 70, 70), Rgb888::new(70, 150, 255), Rgb888::new(210, 210, 210)];
/// Cluster colours, cycled by cluster id.
const PALETTE: [Rgb888; 10] = [
    Rgb888::new(230, 25, 75),
    Rgb888::new(60, 180, 75),
    Rgb888::new(255, 225, 25),
    Rgb888::new(0, 130, 200),
    Rgb888::new(245, 130, 48),
    Rgb888::new(145, 30, 180),
    Rgb888::new(70, 240, 240),
    Rgb888::new(240, 50, 230),
    Rgb888::new(210, 245, 60),
    Rgb888::new(250, 190, 190),
];

/// One picture's content.
pub struct Scene<'a> {
    pub cloud: &'a Cloud,
    pub detections: &'a Detections,
    /// Ground-truth boxes, if known.
    pub truth: &'a [Box3d],
    /// First line: the frame (stamp or name); then counts.
    pub lines: Vec<String>,
}

/// An RGB picture that embedded-graphics draws into; off-picture pixels are dropped.
struct Canvas {
    pixels: Vec<u8>,
}

impl Canvas {
    fn new() -> Self {
        let mut pixels = Vec::with_capacity((SIZE * SIZE * 3) as usize);
        for _ in 0..SIZE * SIZE {
            pixels.extend_from_slice(&[BACKGROUND.r(), BACKGROUND.g(), BACKGROUND.b()]);
        }
        Self { pixels }
    }
    fn put(&mut self, p: Point, c: Rgb888) {
        if p.x >= 0 && p.y >= 0 && (p.x as u32) < SIZE && (p.y as u32) < SIZE {
            let i = 3 * (p.y as usize * SIZE as usize + p.x as usize);
            self.pixels[i..i + 3].copy_from_slice(&[c.r(), c.g(), c.b()]);
        }
    }
}

impl OriginDimensions for Canvas {
    fn size(&self) -> Size {
        Size::new(SIZE, SIZE)
    }
}

impl DrawTarget for Canvas {
    type Color = Rgb888;
    type Error = std::convert::Infallible;
    fn draw_iter<I: IntoIterator<Item = Pixel<Rgb888>>>(&mut self, pixels: I) -> Result<(), Self::Error> {
        for Pixel(p, c) in pixels {
            self.put(p, c);
        }
        Ok(())
    }
}

/// World (x forward = up, y left = left) to pixels over a square view.
struct View {
    cx: f32,
    cy: f32,
    metres_per_pixel: f32,
}

impl View {
    /// The square around the central 98 % of the segmented points on each axis (out-of-range
    /// points and a few far returns left out), with 4 m of margin.
    fn fit(cloud: &Cloud, d: &Detections) -> Self {
        let inside = |i: &usize| d.point_class.get(*i).is_none_or(|&c| c != PointClass::OutOfRange as u8);
        let mut axes: [Vec<f32>; 2] =
            [0, 1].map(|a| (0..cloud.len()).filter(inside).map(|i| cloud.point(i)[a]).collect());
        if axes[0].is_empty() {
            return Self { cx: 0.0, cy: 0.0, metres_per_pixel: 0.1 };
        }
        for v in &mut axes {
            v.sort_by(f32::total_cmp);
        }
        let lo = axes.each_ref().map(|v| v[v.len() / 100]);
        let hi = axes.each_ref().map(|v| v[v.len() - 1 - v.len() / 100]);
        let side = (hi[0] - lo[0]).max(hi[1] - lo[1]) + 8.0;
        Self { cx: (lo[0] + hi[0]) * 0.5, cy: (lo[1] + hi[1]) * 0.5, metres_per_pixel: side / SIZE as f32 }
    }
    fn px(&self, x: f32, y: f32) -> Point {
        let half = SIZE as f32 * 0.5;
        Point::new(
            (half + (self.cy - y) / self.metres_per_pixel).round() as i32,
            (half + (self.cx - x) / self.metres_per_pixel).round() as i32,
        )
    }
}

fn corners(b: &Box3d) -> [(f32, f32); 4] {
    let (s, c) = b.yaw.sin_cos();
    let (hl, hw) = (b.length * 0.5, b.width * 0.5);
    [(hl, hw), (-hl, hw), (-hl, -hw), (hl, -hw)].map(|(u, v)| (b.x + u * c - v * s, b.y + u * s + v * c))
}

fn draw_box(canvas: &mut Canvas, view: &View, b: &Box3d, colour: Rgb888, heading: bool) {
    let style = PrimitiveStyle::with_stroke(colour, 2);
    let k = corners(b).map(|(x, y)| view.px(x, y));
    for i in 0..4 {
        let _ = Line::new(k[i], k[(i + 1) % 4]).into_styled(style).draw(canvas);
    }
    if heading {
        let (s, c) = b.yaw.sin_cos();
        let front = view.px(b.x + b.length * 0.5 * c, b.y + b.length * 0.5 * s);
        let _ = Line::new(view.px(b.x, b.y), front).into_styled(style).draw(canvas);
    }
}

fn text(canvas: &mut Canvas, s: &str, at: Point, big: bool, colour: Rgb888) {
    let font = if big { &FONT_10X20 } else { &FONT_9X15 };
    let _ = Text::new(s, at, MonoTextStyle::new(font, colour)).draw(canvas);
}

/// A scale bar of a round length near a sixth of the picture, bottom left.
fn scale_bar(canvas: &mut Canvas, view: &View) {
    let want = SIZE as f32 * view.metres_per_pixel / 6.0;
    let metres = [1.0f32, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0].into_iter().rfind(|&m| m <= want).unwrap_or(1.0);
    let len = (metres / view.metres_per_pixel).round() as i32;
    let y = SIZE as i32 - 30;
    let style = PrimitiveStyle::with_stroke(TEXT, 3);
    let _ = Line::new(Point::new(20, y), Point::new(20 + len, y)).into_styled(style).draw(canvas);
    for x in [20, 20 + len] {
        let _ = Line::new(Point::new(x, y - 8), Point::new(x, y + 8)).into_styled(style).draw(canvas);
    }
    text(canvas, &format!("{metres} m"), Point::new(20 + len + 10, y + 5), true, TEXT);
}

fn legend(canvas: &mut Canvas, with_truth: bool) {
    let mut entries: Vec<(&str, Rgb888)> = vec![("ground", GROUND), ("other points", UNCLUSTERED)];
    entries.extend(CLASS_NAMES.iter().zip(CLASS_COLOURS).map(|(n, c)| (*n, c)));
    if with_truth {
        entries.push(("ground truth", TRUTH));
    }
    let x = SIZE as i32 - 170;
    for (i, (name, colour)) in entries.iter().enumerate() {
        let y = SIZE as i32 - 20 - 20 * (entries.len() - 1 - i) as i32;
        let _ = Rectangle::new(Point::new(x, y - 10), Size::new(14, 10))
            .into_styled(PrimitiveStyle::with_fill(*colour))
            .draw(canvas);
        text(canvas, name, Point::new(x + 22, y), false, TEXT);
    }
}

/// Draws `scene` and writes it as a PNG at `path`.
pub fn write_png(scene: &Scene<'_>, path: &Path) -> std::io::Result<()> {
    let d = scene.detections;
    let view = View::fit(scene.cloud, d);
    let mut canvas = Canvas::new();
    for i in 0..scene.cloud.len() {
        let q = scene.cloud.point(i);
        let colour = match (d.point_class.get(i).copied(), d.labels.get(i).copied()) {
            (_, Some(l)) if l >= 0 => PALETTE[l as usize % PALETTE.len()],
            (Some(c), _) if c == PointClass::Ground as u8 => GROUND,
            (Some(c), _) if c == PointClass::OutOfRange as u8 => continue,
            _ => UNCLUSTERED,
        };
        let p = view.px(q[0], q[1]);
        canvas.put(p, colour);
        canvas.put(p + Point::new(1, 0), colour);
        canvas.put(p + Point::new(0, 1), colour);
        canvas.put(p + Point::new(1, 1), colour);
    }
    for b in scene.truth {
        draw_box(&mut canvas, &view, b, TRUTH, false);
    }
    for c in d.kept() {
        draw_box(&mut canvas, &view, &c.bbox, CLASS_COLOURS[c.class.clamp(0, 3) as usize], true);
    }
    // The sensor.
    let o = view.px(0.0, 0.0);
    let _ = Rectangle::new(o - Point::new(3, 3), Size::new(7, 7))
        .into_styled(PrimitiveStyle::with_fill(TEXT))
        .draw(&mut canvas);
    for (i, line) in scene.lines.iter().enumerate() {
        text(&mut canvas, line, Point::new(16, 28 + 24 * i as i32), i == 0, TEXT);
    }
    scale_bar(&mut canvas, &view);
    legend(&mut canvas, !scene.truth.is_empty());
    let file = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut enc = png::Encoder::new(file, SIZE, SIZE);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(std::io::Error::other)?;
    w.write_image_data(&canvas.pixels).map_err(std::io::Error::other)?;
    w.finish().map_err(std::io::Error::other)
}

/// The picture's counts line.
pub fn counts_line(d: &Detections, points: usize) -> String {
    format!(
        "{points} points, {} ground, {} clusters, {} boxes after NMS",
        d.count(PointClass::Ground),
        d.clusters.len(),
        d.keep.len()
    )
}
