//! Every colour and text style of the console, named by what it means on screen ([`Styles`]).
//! Panels ask for `styles.dim()` or `styles.load_bar(healthy, over)` and never build a style of
//! their own, so the look is changed here and only here.
//!
//! Colour is never the only carrier of a distinction: the panels pair it with a glyph or a word, so
//! a monochrome terminal or a text snapshot loses nothing.

use ratatui::style::{Color, Modifier, Style};

/// What a status word or a line says about the thing it describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tone {
    /// Working as it should: connected, applied, healthy.
    Good,
    /// Needs a look but is not broken: connecting, pending, a spill that found a target, a notice.
    Warning,
    /// Broken or refused: disconnected, failed, down, over the bound.
    Alert,
}

/// The console's palette and the styles built from it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Styles {
    /// Focused borders, the help overlay, the request-rate sparkline.
    accent: Color,
    /// Labels, units, borders of unfocused panels: everything that frames a number.
    dim: Color,
    good: Color,
    warning: Color,
    alert: Color,
    /// The `mean × max_load_skew` marker and the spill-rate sparkline; the `min + min_load_gap`
    /// marker uses `warning`.
    skew: Color,
    /// Text drawn on a coloured background.
    ink: Color,
    /// Worker colours in the ring panel; workers past its length reuse it from the start (their
    /// glyphs still tell them apart).
    palette: [Color; 12],
}

impl Default for Styles {
    fn default() -> Self {
        Self {
            accent: Color::Cyan,
            dim: Color::DarkGray,
            good: Color::Green,
            warning: Color::Yellow,
            alert: Color::Red,
            skew: Color::Magenta,
            ink: Color::Black,
            palette: [
                Color::Cyan,
                Color::Green,
                Color::Yellow,
                Color::Blue,
                Color::Magenta,
                Color::Red,
                Color::LightCyan,
                Color::LightGreen,
                Color::LightYellow,
                Color::LightBlue,
                Color::LightMagenta,
                Color::LightRed,
            ],
        }
    }
}

impl Styles {
    /// Text as the terminal draws it by default.
    pub(super) fn plain(&self) -> Style {
        Style::new()
    }

    /// Labels and units around the numbers, and anything secondary.
    pub(super) fn dim(&self) -> Style {
        Style::new().fg(self.dim)
    }

    /// A number or name the operator reads first (policy values, a worker's load).
    pub(super) fn value(&self) -> Style {
        Style::new().bold()
    }

    /// The console's name tag at the start of the header.
    pub(super) fn brand(&self) -> Style {
        Style::new().bold().reversed()
    }

    /// A panel's border: accented when it has focus (the panels also switch to a double border).
    pub(super) fn focused(&self, focused: bool) -> Style {
        Style::new().fg(if focused { self.accent } else { self.dim })
    }

    /// A line or span coloured by what it says.
    pub(super) fn tone(&self, tone: Tone) -> Style {
        Style::new().fg(match tone {
            Tone::Good => self.good,
            Tone::Warning => self.warning,
            Tone::Alert => self.alert,
        })
    }

    /// A status word (CONNECTED, RESYNCING, ✓ applied, OVER): its tone, in bold.
    pub(super) fn status(&self, tone: Tone) -> Style {
        self.tone(tone).bold()
    }

    /// The PAUSED badge, reversed out so a frozen screen is never mistaken for a live one.
    pub(super) fn paused(&self) -> Style {
        Style::new().fg(self.ink).bg(self.warning).bold()
    }

    /// The key filter as it is being typed.
    pub(super) fn prompt(&self) -> Style {
        self.status(Tone::Warning)
    }

    /// Column headings of the key table.
    pub(super) fn table_header(&self) -> Style {
        self.dim().bold()
    }

    /// The request-rate sparkline.
    pub(super) fn requests_sparkline(&self) -> Style {
        Style::new().fg(self.accent)
    }

    /// The spill-rate sparkline, in the skew marker's colour.
    pub(super) fn spills_sparkline(&self) -> Style {
        Style::new().fg(self.skew)
    }

    /// The shed-rate sparkline: a shed request is an answer the client did not get.
    pub(super) fn sheds_sparkline(&self) -> Style {
        Style::new().fg(self.alert)
    }

    /// The `min + min_load_gap` marker (`│`), also used where both markers share a cell.
    pub(super) fn gap_marker(&self) -> Style {
        Style::new().fg(self.warning)
    }

    /// The `mean × max_load_skew` marker (`┊`).
    pub(super) fn skew_marker(&self) -> Style {
        Style::new().fg(self.skew)
    }

    /// A worker's capacity marker (`┃`): at it the worker is full and takes no new request.
    pub(super) fn cap_marker(&self) -> Style {
        Style::new().fg(self.alert).bold()
    }

    /// The filled part of a load bar: dim for a worker that is down, alert over the bound, good
    /// otherwise.
    pub(super) fn load_bar(&self, healthy: bool, over: bool) -> Style {
        match (healthy, over) {
            (false, _) => self.dim(),
            (true, true) => self.tone(Tone::Alert),
            (true, false) => self.tone(Tone::Good),
        }
    }

    /// A bound marker inside the filled part of a bar, reversed so the bar visibly runs through it.
    pub(super) fn marker_on_bar(&self, marker: Style, bar: Style) -> Style {
        marker.bg(bar.fg.unwrap_or(Color::Reset)).fg(self.ink)
    }

    /// A worker's name: crossed out and dim while it is down, reversed when selected.
    pub(super) fn name(&self, healthy: bool, selected: bool) -> Style {
        let style = if healthy {
            Style::new()
        } else {
            self.dim().add_modifier(Modifier::CROSSED_OUT)
        };
        if selected { style.reversed() } else { style }
    }

    /// The `i`-th worker's glyph tag in the ring panel: its colour as background.
    pub(super) fn worker(&self, i: usize) -> Style {
        Style::new().fg(self.ink).bg(self.worker_color(i))
    }

    /// The `i`-th worker's share bar in the ring panel.
    pub(super) fn worker_bar(&self, i: usize) -> Style {
        Style::new().fg(self.worker_color(i))
    }

    /// Key names in the help overlay.
    pub(super) fn key_label(&self) -> Style {
        Style::new().fg(self.accent).bold()
    }

    /// The help overlay's border.
    pub(super) fn overlay_border(&self) -> Style {
        Style::new().fg(self.accent)
    }

    fn worker_color(&self, i: usize) -> Color {
        self.palette[i % self.palette.len()]
    }
}
