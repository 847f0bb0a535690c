//! View-only state ([`Ui`]): which panel has focus, how far each panel is scrolled, the key table's
//! sort column, filter and selected key, the worker search prompt, the history pane, and whether
//! the help overlay is open. Nothing here is sent to the
//! gateway or changed by telemetry.

use crate::input::Mode;

/// A panel that can have focus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Panel {
    /// Worker load bars with the spill bound's markers.
    Workers,
    /// Ring ownership: the strip and each worker's share.
    Ring,
    /// Per-key placement table: preferred and current worker of each tracked key.
    Keys,
    /// Spill log, newest first, with the numbers behind each spill.
    Spills,
}

impl Panel {
    /// Every panel, in focus order (Tab moves along it); per-panel arrays (scroll offsets,
    /// viewport heights) are indexed the same way.
    pub const ALL: [Panel; 4] = [Panel::Workers, Panel::Ring, Panel::Keys, Panel::Spills];

    fn index(self) -> usize {
        Panel::ALL.iter().position(|p| *p == self).unwrap_or(0)
    }
}

/// The key table's sort column; `o` cycles through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortColumn {
    /// Most recently seen first (the gateway's own order).
    Recent,
    /// Label, A→Z.
    Key,
    /// Most in-flight requests first.
    Active,
    /// Most requests first.
    Requests,
    /// Most spills first.
    Spills,
}

impl SortColumn {
    /// Every column, in the order `o` cycles through them.
    pub const ALL: [SortColumn; 5] = [
        SortColumn::Recent,
        SortColumn::Key,
        SortColumn::Active,
        SortColumn::Requests,
        SortColumn::Spills,
    ];

    /// Short name shown in the key table's title (`sort recent`).
    pub fn name(self) -> &'static str {
        match self {
            SortColumn::Recent => "recent",
            SortColumn::Key => "key",
            SortColumn::Active => "active",
            SortColumn::Requests => "requests",
            SortColumn::Spills => "spills",
        }
    }

    fn next(self) -> Self {
        let i = SortColumn::ALL.iter().position(|c| *c == self).unwrap_or(0);
        SortColumn::ALL[(i + 1) % SortColumn::ALL.len()]
    }
}

/// The workers panel's row order; `l` toggles it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerOrder {
    /// Configuration order (the gateway's), so rows do not jump.
    Config,
    /// Most in-flight requests first: an overloaded worker cannot be scrolled out of view.
    Load,
}

impl WorkerOrder {
    /// Short name shown in the workers panel's title.
    pub fn name(self) -> &'static str {
        match self {
            WorkerOrder::Config => "config",
            WorkerOrder::Load => "load",
        }
    }
}

/// What the history pane (Enter) shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HistoryOf {
    /// The selected key's placements over time and its spills.
    Key,
    /// The selected worker's load over the last minutes.
    Worker,
}

/// Where the view stood when the worker search opened; Esc goes back to it.
#[derive(Debug, Clone, PartialEq)]
struct SearchOrigin {
    focus: Panel,
    selected_worker: Option<String>,
    scroll: usize,
}

/// View-only state: focus, scrolling, sorting, filter, overlays.
#[derive(Debug, Clone, PartialEq)]
pub struct Ui {
    focus: Panel,
    worker_order: WorkerOrder,
    /// The worker row the drain keys act on, by name (rows move when sorted by load).
    selected_worker: Option<String>,
    /// First visible row per panel, indexed like [`Panel::ALL`].
    scroll: [usize; 4],
    sort: SortColumn,
    /// The key the history pane acts on, by label (rows move as keys are seen).
    selected_key: Option<String>,
    /// The history pane is open on the selected key or worker.
    history: Option<HistoryOf>,
    filter: String,
    filter_editing: bool,
    /// The worker search typed after `f`; empty when no search is open.
    search: String,
    /// While the search prompt is open: where the workers panel was when it opened (focus,
    /// selected worker, scroll), so Esc puts it back.
    search_origin: Option<SearchOrigin>,
    help: bool,
    /// The warnings pane is open.
    warnings: bool,
    /// Content rows each panel showed at the last draw (0 before the first), so scrolling stops
    /// at the last full page.
    viewport: [usize; 4],
    /// The model whose pool the panels show; `None`: every worker.
    pool: Option<String>,
}

impl Default for Ui {
    fn default() -> Self {
        Self {
            focus: Panel::Workers,
            worker_order: WorkerOrder::Config,
            selected_worker: None,
            scroll: [0; 4],
            sort: SortColumn::Recent,
            selected_key: None,
            history: None,
            filter: String::new(),
            filter_editing: false,
            search: String::new(),
            search_origin: None,
            help: false,
            warnings: false,
            viewport: [0; 4],
            pool: None,
        }
    }
}

impl Ui {
    /// The panel that scrolling keys act on, drawn with a double border.
    pub fn focus(&self) -> Panel {
        self.focus
    }

    /// The column the key table is sorted by.
    pub fn sort(&self) -> SortColumn {
        self.sort
    }

    /// The workers panel's row order.
    pub fn worker_order(&self) -> WorkerOrder {
        self.worker_order
    }

    /// The worker the drain keys act on, when one was picked (else the first row).
    pub fn selected_worker(&self) -> Option<&str> {
        self.selected_worker.as_deref()
    }

    pub(super) fn select_worker(&mut self, name: String) {
        self.selected_worker = Some(name);
    }

    pub(super) fn toggle_worker_order(&mut self) {
        self.worker_order = match self.worker_order {
            WorkerOrder::Config => WorkerOrder::Load,
            WorkerOrder::Load => WorkerOrder::Config,
        };
    }

    /// The key the history pane acts on, when one was picked (else the key table's first row).
    pub fn selected_key(&self) -> Option<&str> {
        self.selected_key.as_deref()
    }

    pub(super) fn select_key(&mut self, key: String) {
        self.selected_key = Some(key);
    }

    /// What the history pane shows, while it is open.
    pub fn history_of(&self) -> Option<HistoryOf> {
        self.history
    }

    pub(super) fn open_history(&mut self, of: HistoryOf) {
        self.history = Some(of);
    }

    pub(super) fn close_history(&mut self) {
        self.history = None;
    }

    /// The key filter: a case-insensitive substring of the key label, applied live while typing.
    pub fn filter(&self) -> &str {
        &self.filter
    }

    /// Whether the `/` prompt is open (letters go into the filter, not to the commands).
    pub fn filter_editing(&self) -> bool {
        self.filter_editing
    }

    /// The worker search being typed (a case-insensitive part of a worker's name), while the `f`
    /// prompt is open; `None` otherwise.
    pub fn search(&self) -> Option<&str> {
        self.search_origin.as_ref().map(|_| self.search.as_str())
    }

    /// The model whose pool the panels show (`m`, `--model`); `None`: every worker.
    pub fn pool(&self) -> Option<&str> {
        self.pool.as_deref()
    }

    /// Shows `model`'s pool, or every worker. Scrolling starts again at the top: the rows of
    /// another pool are other rows.
    pub(super) fn set_pool(&mut self, model: Option<String>) {
        if self.pool != model {
            self.scroll = [0; 4];
        }
        self.pool = model;
    }

    /// Whether the warnings pane is open.
    pub fn warnings_open(&self) -> bool {
        self.warnings
    }

    /// Opens or closes the warnings pane.
    pub(super) fn toggle_warnings(&mut self) {
        self.warnings = !self.warnings;
    }

    /// Whether the help overlay is open.
    pub fn help_open(&self) -> bool {
        self.help
    }

    /// Which key bindings apply now: an open overlay or prompt takes the keyboard from the panels.
    pub(crate) fn mode(&self) -> Mode {
        if self.help {
            Mode::Help
        } else if self.search_origin.is_some() {
            Mode::Search
        } else if self.filter_editing {
            Mode::Filter
        } else {
            Mode::Normal
        }
    }

    /// First row the panel asks to show, as last scrolled (the view clamps it to the content).
    pub fn scroll(&self, panel: Panel) -> usize {
        self.scroll[panel.index()]
    }

    /// Content rows `panel` showed at the last draw; 0 before the first.
    pub fn viewport(&self, panel: Panel) -> usize {
        self.viewport[panel.index()]
    }

    pub(super) fn set_viewports(&mut self, rows: [usize; 4]) {
        self.viewport = rows;
    }

    pub(super) fn focus_step(&mut self, forward: bool) {
        let n = Panel::ALL.len();
        let step = if forward { 1 } else { n - 1 };
        self.focus = Panel::ALL[(self.focus.index() + step) % n];
    }

    /// Scrolls the focused panel by `delta` rows (negative is up), stopping at `max`.
    pub(super) fn scroll_by(&mut self, delta: i32, max: usize) {
        let slot = &mut self.scroll[self.focus.index()];
        *slot = slot.saturating_add_signed(delta as isize).min(max);
    }

    pub(super) fn scroll_to(&mut self, row: usize) {
        self.scroll[self.focus.index()] = row;
    }

    /// Scrolls the workers panel to `row`, whichever panel has focus.
    pub(super) fn scroll_workers_to(&mut self, row: usize) {
        self.scroll[Panel::Workers.index()] = row;
    }

    pub(super) fn cycle_sort(&mut self) {
        self.sort = self.sort.next();
    }

    /// Opens the `/` prompt; the key table takes focus so the operator sees what the filter does.
    pub(super) fn start_filter(&mut self) {
        self.filter_editing = true;
        self.focus = Panel::Keys;
    }

    /// Types `c` into the filter. Back to the first row: the rows below may be gone.
    pub(super) fn type_filter(&mut self, c: char) {
        self.filter.push(c);
        self.scroll[Panel::Keys.index()] = 0;
    }

    pub(super) fn erase_filter_char(&mut self) {
        self.filter.pop();
    }

    pub(super) fn keep_filter(&mut self) {
        self.filter_editing = false;
    }

    pub(super) fn clear_filter(&mut self) {
        self.filter_editing = false;
        self.filter.clear();
    }

    /// Opens the `f` prompt on the workers panel, remembering where the view stands for Esc.
    pub(super) fn start_search(&mut self) {
        self.search_origin = Some(SearchOrigin {
            focus: self.focus,
            selected_worker: self.selected_worker.clone(),
            scroll: self.scroll[Panel::Workers.index()],
        });
        self.search.clear();
        self.focus = Panel::Workers;
    }

    /// The search text after typing `c` (`None`: the prompt is not open).
    pub(super) fn type_search(&mut self, c: char) -> Option<&str> {
        self.search_origin.as_ref()?;
        self.search.push(c);
        Some(&self.search)
    }

    /// The search text after erasing its last character (`None`: the prompt is not open).
    pub(super) fn erase_search_char(&mut self) -> Option<&str> {
        self.search_origin.as_ref()?;
        self.search.pop();
        Some(&self.search)
    }

    /// Closes the prompt, keeping the worker it selected.
    pub(super) fn keep_search(&mut self) {
        self.search_origin = None;
        self.search.clear();
    }

    /// Closes the prompt and puts focus, selection and scroll back as they were when it opened.
    pub(super) fn cancel_search(&mut self) {
        if let Some(origin) = self.search_origin.take() {
            self.focus = origin.focus;
            self.selected_worker = origin.selected_worker;
            self.scroll[Panel::Workers.index()] = origin.scroll;
        }
        self.search.clear();
    }

    /// Gives the workers panel focus (a jump to a worker shows it there).
    pub(super) fn focus_workers(&mut self) {
        self.focus = Panel::Workers;
    }

    pub(super) fn toggle_help(&mut self) {
        self.help = !self.help;
    }
}
