//! Output for a terminal, tried in a pseudo-terminal of 80 columns: tables
//! that fit, a pager, the call tree of deep recursion, and `annotate`.
#![allow(clippy::unwrap_used)]

use proftap_tests::*;
use std::path::Path;
use std::process::Command;

/// Runs `proftap ARGS` on a pseudo-terminal 80 columns wide (Python's pty
/// module): what it wrote there, carriage returns removed.
fn on_terminal(args: &[&str], pager: Option<&str>) -> String {
    let script = "import os, pty, sys, struct, fcntl, termios\n\
                  pid, fd = pty.fork()\n\
                  if pid == 0:\n\
                  \x20   fcntl.ioctl(1, termios.TIOCSWINSZ, struct.pack('HHHH', 24, 80, 0, 0))\n\
                  \x20   os.execvp(sys.argv[1], sys.argv[1:])\n\
                  out = b''\n\
                  while True:\n\
                  \x20   try:\n\
                  \x20       data = os.read(fd, 65536)\n\
                  \x20   except OSError:\n\
                  \x20       break\n\
                  \x20   if not data:\n\
                  \x20       break\n\
                  \x20   out += data\n\
                  _, status = os.waitpid(pid, 0)\n\
                  sys.stdout.buffer.write(out)\n\
                  sys.exit(os.waitstatus_to_exitcode(status))\n";
    let mut command = Command::new("python3");
    command.args(["-c", script]).arg(binary("proftap")).args(args).env_remove("COLUMNS").env("NO_COLOR", "1");
    match pager {
        Some(pager) => command.env("PAGER", pager),
        None => command.env_remove("PAGER"),
    };
    run_ok(&mut command).replace('\r', "")
}

fn assert_fits(text: &str, width: usize) {
    for line in text.lines() {
        assert!(line.chars().count() <= width, "a line of {} columns:\n{line}\nin:\n{text}", line.chars().count());
    }
}

fn record(args: &[&str], program: &Path, dir: &Path) -> String {
    let file = dir.join("p.profile");
    run_ok(proftap().arg("run").args(args).arg("-o").arg(&file).arg("--").arg(program));
    file.to_string_lossy().into_owned()
}

#[test]
fn reports_fit_the_terminal_and_go_through_a_pager() {
    require_probes();
    require("python3", "for a pseudo-terminal");
    let dir = tempfile::tempdir().unwrap();
    // C++: long qualified names; sampled too, so the report has every table.
    let profile = record(&["-F", "2000"], &Build::cxx("shapes.cpp", "-O2").build(), dir.path());
    let text = on_terminal(&["report", &profile], Some("cat"));
    assert!(text.contains("Flat profile"), "{text}");
    assert!(text.lines().nth(1).unwrap().starts_with("  hottest     "), "{text}");
    assert_fits(&text, 80);
    // The same report to a pipe keeps every column and name.
    let piped = run_ok(proftap().arg("report").arg(&profile));
    assert!(piped.lines().any(|l| l.chars().count() > 80) && piped.contains("min"), "{piped}");
    // A pager when the output is a terminal; none with --no-pager.
    let paged = on_terminal(&["report", &profile], Some("sed s/^/paged:/"));
    assert!(paged.lines().all(|l| l.starts_with("paged:")), "{paged}");
    let direct = on_terminal(&["report", "--no-pager", &profile], Some("sed s/^/paged:/"));
    assert!(!direct.contains("paged:") && direct.contains("Flat profile"), "{direct}");
}

#[test]
fn the_tree_of_deep_recursion_fits_in_80_columns() {
    require_probes();
    require("python3", "for a pseudo-terminal");
    let dir = tempfile::tempdir().unwrap();
    let profile = record(&["-f", "down", "-f", "main"], &Build::c("deep.c", "-O2").build(), dir.path());
    let text = on_terminal(&["report", "--tree", "--depth", "10", &profile], Some("cat"));
    assert_fits(&text, 80);
    // main, then down with its 1,000 levels below folded into its line
    // (wrapped on the terminal).
    let tree: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("Call tree")).skip(1).collect();
    assert!(tree[0].trim_start().starts_with("main 1x"), "{text}");
    assert!(tree[1].trim_start().starts_with("down 3x"), "{text}");
    let words = tree.join(" ").split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(words.contains("[recursion: +1,000 levels, 3,000 calls,"), "{text}");
    // Under a share of the run, contexts are counted, not shown.
    let text = run_ok(proftap().args(["report", "--tree", "--min-share", "100", &profile]));
    assert!(text.contains("1,002 calling contexts under 100% of the run not shown"), "{text}");
    assert!(!text.contains("main 1x"), "{text}");
}

#[test]
fn annotate_shows_counts_times_and_samples_per_line() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let program = Build::c("coverage.c", "-O0").build();
    let profile = record(&["--lines=coverage.c"], &program, dir.path());
    let json = report_json(Path::new(&profile));
    let text = run_ok(proftap().args(["annotate", "classify", &profile]));
    assert!(text.starts_with("proftap annotate: classify ("), "{text}");
    // Every line with a count shows the profile's count.
    let mut checked = 0;
    for line in json["lines"].as_array().unwrap() {
        let number = line["line"].as_u64().unwrap();
        let Some(row) = text.lines().find(|r| r.split(':').next().is_some_and(|head| head.trim_end().ends_with(&format!(" {number}"))))
        else {
            continue;
        };
        let count = line["count"].as_u64().unwrap();
        let shown = row.split_whitespace().next().unwrap();
        assert_eq!(shown, if count == 0 { "#####".to_string() } else { count.to_string() }, "line {number}: {row}");
        checked += 1;
    }
    assert!(checked >= 3, "{text}");
    // Sampled: each line's share of the samples.
    let sampled = tempfile::tempdir().unwrap();
    let profile = record(&["-f", "burn", "-F", "2000"], &Build::c("cpuwall.c", "-O2").build(), sampled.path());
    let text = run_ok(proftap().args(["annotate", "burn", &profile]));
    assert!(text.lines().nth(1).is_some_and(|h| h.contains("%smp")), "{text}");
    let shares: f64 = text.lines().skip(2).filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok()).sum();
    // The rest is in clock_gettime, which burn calls.
    assert!(shares > 20.0, "burn's loop should hold many samples: {text}");
    let out = run(proftap().args(["annotate", "no_such_function", &profile]));
    assert_clean_failure(&out, "no function named 'no_such_function'");
    // Built from a path through `..`, as a build in a sibling directory
    // names its sources: the samples' lines are the function's file still.
    let program = sampled.path().join("cpuwall-dotdot");
    let source = examples().join("multifile/../cpuwall.c");
    run_ok(Command::new("gcc").args(["-O2", "-g", "-o"]).arg(&program).arg(&source));
    let profile = record(&["-f", "burn", "-f", "nap", "-F", "2000"], &program, sampled.path());
    let text = run_ok(proftap().args(["annotate", "burn", &profile]));
    assert!(text.starts_with("proftap annotate: burn (") && !text.contains("/../"), "{text}");
    // A function none of whose lines were sampled (nap sleeps) is said to be so.
    let out = run(proftap().args(["annotate", "nap", &profile]));
    assert_clean_failure(&out, "no line of nap");
}

/// A function the compiler inlined everywhere, which only the samples
/// name, is annotated from its module's debug info: its declaration found
/// there, its lines' shares of the samples shown.
#[test]
fn annotate_shows_a_function_inlined_everywhere() {
    require_probes();
    let dir = tempfile::tempdir().unwrap();
    let source = dir.path().join("inlined.c");
    std::fs::write(
        &source,
        "static inline __attribute__((always_inline)) unsigned long mix(unsigned long x) {\n\
         \x20   for (int i = 0; i < 64; i++)\n\
         \x20       x = x * 6364136223846793005UL + 1442695040888963407UL;\n\
         \x20   return x;\n\
         }\n\
         int main(int argc, char **argv) {\n\
         \x20   unsigned long x = argc;\n\
         \x20   for (unsigned long i = 0; i < 4000000; i++)\n\
         \x20       x ^= mix(x + i);\n\
         \x20   return (x == 42) + (argv[0] == 0);\n\
         }\n",
    )
    .unwrap();
    let program = dir.path().join("inlined");
    run_ok(Command::new("gcc").args(["-O2", "-g", "-o"]).arg(&program).arg(&source));
    let profile = record(&["--no-instrument", "-F", "2000"], &program, dir.path());
    let json = report_json(Path::new(&profile));
    assert!(!json["functions"].as_array().unwrap().iter().any(|f| f["name"] == "mix"), "mix has no symbol of its own");
    let text = run_ok(proftap().args(["annotate", "mix", "--no-pager", &profile]));
    assert!(text.starts_with(&format!("proftap annotate: mix ({}:1), inlined everywhere it ran", source.display())), "{text}");
    // Its lines, from its declaration to the line before main's, hold most samples.
    let numbers: Vec<u32> = text.lines().skip(2).filter_map(|l| l.split(':').next()?.split_whitespace().last()?.parse().ok()).collect();
    assert_eq!(numbers, vec![1, 2, 3, 4, 5], "{text}");
    let shares: f64 = text.lines().skip(2).filter_map(|l| l.split_whitespace().next()?.parse::<f64>().ok()).sum();
    assert!(shares > 50.0, "mix's loop should hold most samples: {text}");
    // Its debug info moved to a separate file by build-id, as distributions
    // ship it: found where `--debug-dir` says, and said to be missing else.
    let notes = run_ok(Command::new("readelf").arg("-n").arg(&program));
    let id = notes.lines().find_map(|l| l.trim().strip_prefix("Build ID: ")).unwrap_or_else(|| panic!("no build-id: {notes}")).to_string();
    let debug = dir.path().join("debug");
    let kept = debug.join(".build-id").join(&id[..2]).join(format!("{}.debug", &id[2..]));
    std::fs::create_dir_all(kept.parent().unwrap()).unwrap();
    run_ok(Command::new("objcopy").arg("--only-keep-debug").arg(&program).arg(&kept));
    run_ok(Command::new("objcopy").arg("--strip-debug").arg(&program));
    let out = run(proftap().args(["annotate", "mix", "--no-pager", &profile]));
    assert_clean_failure(&out, "has no debug info, nor a separate debug file in /usr/lib/debug");
    let text = run_ok(proftap().args(["annotate", "mix", "--no-pager", &profile, "--debug-dir"]).arg(&debug));
    assert!(text.starts_with(&format!("proftap annotate: mix ({}:1)", source.display())), "{text}");
    // Its module gone, it is said where it was looked for.
    std::fs::remove_file(&program).unwrap();
    let out = run(proftap().args(["annotate", "mix", "--no-pager", &profile]));
    assert_clean_failure(&out, "mix is named by the samples only, and cannot read");
}

/// A tmux server of the test's own, killed when dropped.
struct Tmux {
    socket: String,
}

impl Tmux {
    fn start(width: u32, height: u32, command: &str) -> Tmux {
        let tmux = Tmux { socket: format!("proftap-test-{}-{width}", std::process::id()) };
        run_ok(Command::new("tmux").args([
            "-L",
            &tmux.socket,
            "new-session",
            "-d",
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            command,
        ]));
        tmux
    }

    fn screen(&self) -> String {
        run_ok(Command::new("tmux").args(["-L", &self.socket, "capture-pane", "-p"]))
    }

    fn keys(&self, keys: &str) {
        run_ok(Command::new("tmux").args(["-L", &self.socket, "send-keys", keys]));
    }

    /// Waits (at most a minute) until the screen shows what `done` looks for.
    fn until(&self, mut between: impl FnMut(), done: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(std::time::Instant::now() < deadline, "the terminal never showed what was expected:\n{screen}");
            between();
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux").args(["-L", &self.socket, "kill-server"]).output();
    }
}

#[test]
fn top_shows_a_running_process_s_calls_live_in_a_terminal() {
    require_probes();
    require("tmux", "to try `proftap top` in a real terminal");
    let mut waiter = Waiter::start(&Build::c("wait.c", "-O2").build());
    let command = format!("{} top {} --top 5; echo proftap exited $?; read wait", binary("proftap").display(), waiter.pid);
    let tmux = Tmux::start(100, 20, &command);
    // The program calls tick() while top watches, until its row shows calls.
    let mut ticked = 0;
    let screen = tmux.until(
        || ticked = waiter.tick(500),
        |screen| screen.lines().any(|l| l.ends_with(" tick") && l.split_whitespace().nth(1).is_some_and(|c| c != "0")),
    );
    assert!(screen.lines().any(|l| l.starts_with("proftap top: ")), "{screen}");
    let row = screen.lines().find(|l| l.ends_with(" tick")).unwrap();
    let calls: u64 = row.split_whitespace().nth(1).unwrap().replace(',', "").parse().unwrap();
    // Counted from the moment top attached: at most the ticks made so far
    // (no round runs while the screen is read).
    assert!(calls > 0 && calls <= ticked, "{calls} of {ticked}: {screen}");
    assert!(screen.lines().all(|l| l.chars().count() <= 100));
    // Ctrl-C ends the watch; the process runs on, its code restored.
    tmux.keys("C-c");
    let screen = tmux.until(|| {}, |screen| screen.contains("proftap exited"));
    assert!(screen.contains("proftap exited 0"), "{screen}");
    waiter.tick(3);
    let (_, status) = waiter.finish();
    assert!(status.success(), "{status:?}");
}
