//! `proftap symbols`: what proftap sees in a binary, or in a running process.

use crate::status::Terminal;
use anyhow::{Context, Result};
use proftap_probes::addr::LoadBias;
use proftap_probes::procfs::{self, LoadedModule};
use proftap_probes::select::{Selected, Selection};
use proftap_probes::symbols::{DebugDirs, DebugSource, Debuginfod, ElfImage, FetchProgress, Function, LoadOptions, SymbolIndex};
use proftap_record::observer::ObservedDownloads;
use serde::Serialize;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

/// Arguments of `proftap symbols`.
#[derive(clap::Args)]
#[command(group = clap::ArgGroup::new("target").required(true).args(["binary", "pid"]))]
pub struct Args {
    /// An executable or shared library.
    binary: Option<PathBuf>,
    /// A running process: its loaded modules and their load bias, and the
    /// runtime addresses of the selected functions.
    #[arg(long, value_name = "PID")]
    pid: Option<i32>,
    /// Functions to list: a glob on names (`parse_*`, `ns::Class::*`), `FILE:*`
    /// for a source file, `MODULE:PAT` for a shared library, `!PAT` to exclude.
    /// Default: every function with debug info, without C runtime scaffolding.
    #[arg(short = 'f', long = "functions", value_name = "PAT")]
    functions: Vec<String>,
    /// Also list the line-table rows (of the selected functions when -f is given).
    #[arg(long)]
    lines: bool,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    format: Format,
    /// Where separate debug files are looked for (repeatable; default /usr/lib/debug).
    /// With DEBUGINFOD_URLS set, debuginfod servers are asked for what is
    /// not found there.
    #[arg(long, value_name = "DIR")]
    debug_dir: Vec<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum Format {
    Text,
    Json,
}

/// The debuginfod settings of this environment (`DEBUGINFOD_URLS` and the
/// rest, as elfutils reads them), saying what cannot be honoured.
pub fn debuginfod_from_env() -> Option<Debuginfod> {
    let (settings, warnings) = Debuginfod::from_vars(|name| std::env::var_os(name));
    for warning in warnings {
        eprintln!("proftap: warning: {warning}");
    }
    settings
}

/// Runs the command.
pub fn run(args: Args) -> Result<ExitCode> {
    let selection = Selection::parse(&args.functions)?;
    let options = LoadOptions {
        lines: args.lines,
        debug_dirs: DebugDirs::asked_or_default(&args.debug_dir),
        debuginfod: debuginfod_from_env(),
        symbol_tables_enough: false,
        kept_reads: None,
    };
    // Shows downloads from debuginfod servers as they go; gone before the output.
    let terminal = Terminal::start(false);
    let progress = ObservedDownloads(&terminal);
    let (indexes, loaded) = match (&args.binary, args.pid) {
        (Some(binary), _) => (vec![load(binary, &options, &progress)?], Vec::new()),
        (None, Some(pid)) => load_process(pid, &selection, &options, &progress)?,
        (None, None) => unreachable!("clap requires a binary or --pid"),
    };
    drop(terminal);
    let refs: Vec<&SymbolIndex> = indexes.iter().collect();
    let selected = selection.select(&refs)?;
    let report = build_report(&indexes, &loaded, &selected, args.lines && !selection.is_default(), args.lines);

    for index in &indexes {
        for warning in &index.warnings {
            eprintln!("proftap: warning: {warning}");
        }
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let written = match args.format {
        Format::Json => serde_json::to_writer_pretty(&mut out, &report).map_err(std::io::Error::from).and_then(|()| writeln!(out)),
        Format::Text => write_text(&mut out, &report),
    }
    .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(ExitCode::SUCCESS),
        other => other.map(|()| ExitCode::SUCCESS).context("cannot write to standard output"),
    }
}

fn load(path: &std::path::Path, options: &LoadOptions, progress: &dyn FetchProgress) -> proftap_probes::Result<SymbolIndex> {
    SymbolIndex::of_image_observed(&ElfImage::open(path)?, options, progress)
}

/// Loads the main executable, and the shared libraries the patterns name.
fn load_process(
    pid: i32,
    selection: &Selection,
    options: &LoadOptions,
    progress: &dyn FetchProgress,
) -> Result<(Vec<SymbolIndex>, Vec<LoadedModule>)> {
    let modules = procfs::loaded_modules(pid)?;
    let mut indexes = Vec::new();
    let mut loaded = Vec::new();
    for module in modules {
        if !module.is_main && !selection.names_module(&module.path) {
            loaded.push(module);
            continue;
        }
        let mut index = load(&module.open_path, options, progress)
            .with_context(|| format!("cannot read the symbols of {} in process {pid}", module.path.display()))?;
        index.path.clone_from(&module.path);
        indexes.push(index);
        loaded.insert(indexes.len() - 1, module);
    }
    Ok((indexes, loaded))
}

#[derive(Serialize)]
struct Report<'a> {
    schema: &'static str,
    modules: Vec<ModuleRow<'a>>,
    functions: Vec<FunctionRow<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lines: Option<Vec<LineRowOut<'a>>>,
    warnings: Vec<&'a str>,
}

#[derive(Serialize)]
struct ModuleRow<'a> {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<proftap_probes::symbols::ElfKind>,
    #[serde(skip_serializing_if = "Option::is_none")]
    build_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    debug_info: Option<&'a DebugSource>,
    #[serde(skip_serializing_if = "Option::is_none")]
    load_bias: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    compile_units: Option<Vec<UnitRow<'a>>>,
}

#[derive(Serialize)]
struct UnitRow<'a> {
    name: &'a str,
    dwarf_version: u16,
    rows: usize,
}

#[derive(Serialize)]
struct FunctionRow<'a> {
    name: &'a str,
    raw_name: &'a str,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    aliases: &'a [String],
    module: usize,
    address: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtime_address: Option<u64>,
    file_offset: Option<u64>,
    size: u64,
    file: Option<&'a str>,
    line: Option<u32>,
    has_dwarf: bool,
    origin: proftap_probes::symbols::SymbolOrigin,
}

#[derive(Serialize)]
struct LineRowOut<'a> {
    module: usize,
    address: u64,
    file: &'a str,
    line: u32,
    is_stmt: bool,
    end_sequence: bool,
}

fn build_report<'a>(
    indexes: &'a [SymbolIndex],
    loaded: &[LoadedModule],
    selected: &[Selected],
    only_selected_lines: bool,
    lines: bool,
) -> Report<'a> {
    let bias = |m: usize| loaded.get(m).map(|l| l.bias);
    let mut modules: Vec<ModuleRow> = indexes
        .iter()
        .enumerate()
        .map(|(m, index)| ModuleRow {
            path: index.path.display().to_string(),
            kind: Some(index.kind),
            build_id: index.build_id.as_deref(),
            debug_info: Some(&index.debug),
            load_bias: bias(m).map(|b| b.0),
            compile_units: lines.then(|| {
                index.units.iter().map(|u| UnitRow { name: &u.name, dwarf_version: u.dwarf_version, rows: u.rows.len() }).collect()
            }),
        })
        .collect();
    modules.extend(loaded.iter().skip(indexes.len()).map(|l| ModuleRow {
        path: l.path.display().to_string(),
        kind: None,
        build_id: None,
        debug_info: None,
        load_bias: Some(l.bias.0),
        compile_units: None,
    }));

    let functions = selected
        .iter()
        .map(|s| {
            let index = &indexes[s.module];
            let f = &index.functions[s.function];
            function_row(index, f, s.module, bias(s.module))
        })
        .collect();

    let lines = lines.then(|| {
        let mut rows = Vec::new();
        for (m, index) in indexes.iter().enumerate() {
            let mut ranges: Vec<(u64, u64)> = selected
                .iter()
                .filter(|s| s.module == m)
                .map(|s| {
                    let f = &index.functions[s.function];
                    (f.address.0, f.address.0 + f.size.max(1))
                })
                .collect();
            ranges.sort_unstable();
            let in_selected = |addr: u64| {
                let i = ranges.partition_point(|&(lo, _)| lo <= addr);
                i > 0 && addr < ranges[i - 1].1
            };
            for row in &index.line_rows {
                if only_selected_lines && !in_selected(row.address.0) {
                    continue;
                }
                rows.push(LineRowOut {
                    module: m,
                    address: row.address.0,
                    file: index.files.path(row.file),
                    line: row.line,
                    is_stmt: row.is_stmt,
                    end_sequence: row.end_sequence,
                });
            }
        }
        rows
    });

    let warnings = indexes.iter().flat_map(|i| i.warnings.iter().map(String::as_str)).collect();
    Report { schema: "proftap.symbols/1", modules, functions, lines, warnings }
}

fn function_row<'a>(index: &'a SymbolIndex, f: &'a Function, module: usize, bias: Option<LoadBias>) -> FunctionRow<'a> {
    FunctionRow {
        name: &f.name,
        raw_name: &f.raw_name,
        aliases: &f.aliases,
        module,
        address: f.address.0,
        runtime_address: bias.map(|b| b.to_runtime(f.address).0),
        file_offset: f.file_offset.map(|o| o.0),
        size: f.size,
        file: index.decl_path(f),
        line: (f.decl_line != 0).then_some(f.decl_line),
        has_dwarf: f.has_dwarf,
        origin: f.origin,
    }
}

fn describe_debug_source(source: &DebugSource) -> String {
    match source {
        DebugSource::Embedded { compressed: true } => "debug info: embedded, compressed".into(),
        DebugSource::Embedded { compressed: false } => "debug info: embedded".into(),
        DebugSource::BuildId { path } | DebugSource::DebugLink { path } => format!("debug info: {}", path.display()),
        DebugSource::Debuginfod { path, server: Some(server) } => {
            format!("debug info: {} (debuginfod, downloaded from {server})", path.display())
        }
        DebugSource::Debuginfod { path, server: None } => format!("debug info: {} (debuginfod cache)", path.display()),
        DebugSource::Missing => "no debug info".into(),
    }
}

fn write_text(out: &mut impl Write, report: &Report) -> std::io::Result<()> {
    for (m, module) in report.modules.iter().enumerate() {
        let mut facts = Vec::new();
        if let Some(kind) = module.kind {
            facts.push(kind.to_string());
        }
        if let Some(id) = module.build_id {
            facts.push(format!("build-id {id}"));
        }
        if let Some(source) = module.debug_info {
            facts.push(describe_debug_source(source));
        }
        if let Some(bias) = module.load_bias {
            facts.push(format!("load bias {bias:#x}"));
        }
        writeln!(out, "[{m}] {}: {}", module.path, facts.join(", "))?;
    }
    writeln!(out)?;
    let runtime = report.functions.iter().any(|f| f.runtime_address.is_some());
    if runtime {
        writeln!(out, "{:>18} {:>18} {:>10} {:>7}  {:<40} SOURCE", "RUNTIME", "ADDRESS", "OFFSET", "SIZE", "FUNCTION")?;
    } else {
        writeln!(out, "{:>18} {:>10} {:>7}  {:<40} SOURCE", "ADDRESS", "OFFSET", "SIZE", "FUNCTION")?;
    }
    for f in &report.functions {
        let offset = f.file_offset.map_or_else(|| "-".to_string(), |o| format!("{o:#x}"));
        let source = match (f.file, f.line) {
            (Some(file), Some(line)) => format!("{file}:{line}"),
            (Some(file), None) => file.to_string(),
            _ => "-".to_string(),
        };
        let name = if report.modules.len() > 1 { format!("[{}] {}", f.module, f.name) } else { f.name.to_string() };
        if let Some(rt) = f.runtime_address {
            write!(out, "{rt:>#18x} ")?;
        }
        writeln!(out, "{:>#18x} {offset:>10} {:>7}  {name:<40} {source}", f.address, f.size)?;
    }
    if let Some(lines) = &report.lines {
        writeln!(out)?;
        writeln!(out, "{:>18}  {:<6} LINE", "ADDRESS", "FLAGS")?;
        for row in lines {
            let flags = match (row.is_stmt, row.end_sequence) {
                (_, true) => "end",
                (true, false) => "stmt",
                (false, false) => "",
            };
            writeln!(out, "{:>#18x}  {flags:<6} {}:{}", row.address, row.file, row.line)?;
        }
    }
    Ok(())
}
