//! Man pages and shell completions for `ublk-nvmf` and `gimbal-target`,
//! rendered from each binary's own clap [`Command`].
//!
//! Each binary's `main` first hands its `Command` to [`generate_if_asked`],
//! which answers a hidden `generate` subcommand:
//!
//! - `ublk-nvmf generate man DIR` writes `ublk-nvmf.8` and one page per
//!   subcommand (`ublk-nvmf-run.8`, ...);
//! - `ublk-nvmf generate completion bash|zsh|fish` prints a completion
//!   script.
//!
//! Why a hidden subcommand rather than a separate generator program: the
//! command-line definitions live in the binaries' `main.rs`, outside their
//! libraries, and the pages must come from exactly the definition that
//! parses the command line so that they cannot drift from it. A hidden
//! subcommand has that definition at hand, and packaging
//! (`packaging/build-debs`) needs nothing but the release binary it ships:
//! no second program to build. The cost is this small crate (and
//! `clap_mangen`, `clap_complete`) linked into both binaries.
//!
//! `generate` is answered before clap parses the binary's own command line
//! and is not part of its `Command`: `clap_complete` offers hidden
//! subcommands too, and there is no removing one from a `Command`.
//!
//! [`check_binary`] is the binaries' test: every subcommand that `--help`
//! lists must have a description, a man page, an entry in the top page and
//! in every completion script, and every page must render without a
//! warning from `man --warnings`.

use std::collections::BTreeSet;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command as Process, ExitCode};

use clap::{Command, CommandFactory, FromArgMatches, Parser, Subcommand};
use clap_complete::Shell;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

/// Man page metadata and the hand-written sections of a binary's top page.
pub struct ManInfo {
    /// Manual section of every page (`"8"`: daemons and administration).
    pub section: &'static str,
    /// Sections appended to the top page after its subcommand list, e.g.
    /// FILES, ENVIRONMENT, SEE ALSO.
    pub sections: &'static [Section],
}

/// A hand-written man page section.
pub struct Section {
    /// Heading, e.g. `"FILES"`.
    pub title: &'static str,
    /// `(term, text)` entries: a non-empty term is a tagged paragraph
    /// (term in bold, text indented under it); an empty one a plain
    /// paragraph.
    pub entries: &'static [(&'static str, &'static str)],
}

/// The hidden subcommand: `BIN generate man DIR`, `BIN generate completion
/// SHELL`.
#[derive(Parser, Debug)]
#[command(about = "Man pages and shell completions (for packaging)")]
struct Generate {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand, Debug)]
enum What {
    /// Write the man pages (NAME.SECTION, NAME-SUBCOMMAND.SECTION) into DIR.
    Man {
        /// Output directory (created if missing).
        dir: PathBuf,
    },
    /// Print the completion script for SHELL.
    Completion {
        /// bash, zsh, fish, elvish or powershell.
        shell: Shell,
    },
}

/// If the command line is `BIN generate ...`, does it for the binary whose
/// command line `cmd` builds and returns the exit status; otherwise `None`,
/// and the binary parses its command line as usual.
pub fn generate_if_asked(cmd: impl FnOnce() -> Command, info: &ManInfo) -> Option<ExitCode> {
    let mut args = std::env::args_os();
    let bin = args.next()?;
    if args.next()? != "generate" {
        return None;
    }
    let cmd = cmd();
    let usage = format!("{} generate", cmd.get_name());
    let matches = Generate::command()
        .bin_name(&usage)
        .get_matches_from(std::iter::once(bin).chain(args));
    let generate = Generate::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    match run(cmd, info, &generate.what) {
        Ok(()) => Some(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("{usage}: {e}");
            Some(ExitCode::FAILURE)
        }
    }
}

fn run(cmd: Command, info: &ManInfo, what: &What) -> io::Result<()> {
    match what {
        What::Man { dir } => write_man_pages(cmd, info, dir).map(|_| ()),
        What::Completion { shell } => {
            let mut cmd = cmd;
            let name = cmd.get_name().to_owned();
            let mut out = io::stdout().lock();
            clap_complete::generate(*shell, &mut cmd, name, &mut out);
            out.flush()
        }
    }
}

/// Writes the top page and one page per visible subcommand (recursively)
/// into `dir`; returns the files written.
pub fn write_man_pages(cmd: Command, info: &ManInfo, dir: &Path) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    // `help` is a clap convenience, not a command worth a page.
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    // Every page's footer names the package: "ublk-nvmf 0.1.0".
    let source = format!(
        "{} {}",
        cmd.get_name(),
        cmd.get_version().unwrap_or_default()
    );
    let mut written = Vec::new();
    write_page(&cmd, None, info, &source, dir, &mut written)?;
    Ok(written)
}

fn write_page(
    cmd: &Command,
    parent: Option<&str>,
    info: &ManInfo,
    source: &str,
    dir: &Path,
    written: &mut Vec<PathBuf>,
) -> io::Result<()> {
    let name = cmd.get_display_name().unwrap_or(cmd.get_name()).to_owned();
    let man = Man::new(cmd.clone())
        .section(info.section)
        .source(source)
        .manual("System Manager's Manual");
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut page)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(&mut page)?;
    }
    let mut roff = Roff::default();
    // Left-aligned: the hand-written sections are mostly long paths and
    // references, which justification spreads across the line.
    roff.control("ad", ["l"]);
    match parent {
        None => {
            for s in info.sections {
                roff.control("SH", [s.title]);
                for (term, text) in s.entries {
                    if term.is_empty() {
                        roff.control("PP", []);
                    } else {
                        roff.control("TP", []);
                        roff.text([bold(*term)]);
                    }
                    roff.text([roman(*text)]);
                }
            }
            roff.to_writer(&mut page)?;
            man.render_version_section(&mut page)?;
        }
        Some(parent) => {
            roff.control("SH", ["SEE ALSO"]);
            roff.text([bold(parent), roman(format!("({})", info.section))]);
            roff.to_writer(&mut page)?;
        }
    }
    let path = dir.join(format!("{name}.{}", info.section));
    std::fs::write(&path, page)?;
    written.push(path);
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_page(sub, Some(&name), info, source, dir, written)?;
    }
    Ok(())
}

/// Checks what `bin generate` produces against the subcommands `bin --help`
/// lists, writing the pages into `out` (which must not hold other files):
///
/// - every subcommand has a description in `--help` (a doc comment);
/// - the man pages are exactly `bin.SECTION` and `bin-SUB.SECTION` for each;
/// - the top page names every subcommand's page, `bin-SUB(SECTION)`;
/// - every page renders with `man --warnings` without a warning (needs
///   man-db, which `tests/vm/setup-host.sh` installs);
/// - the bash, zsh and fish completion scripts name every subcommand,
///   bash really completes them, and zsh and fish, where installed, accept
///   their scripts' syntax.
///
/// Returns every problem found, one per line.
pub fn check_binary(bin: &Path, section: &str, out: &Path) -> Result<(), String> {
    let mut problems = Vec::new();
    let name = bin
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or("binary path has no name")?
        .to_owned();
    let help = output(Process::new(bin).arg("--help"))?;
    let subs = subcommands_in_help(&help);
    if subs.is_empty() {
        return Err(format!("{name} --help lists no subcommands:\n{help}"));
    }
    for (sub, about) in &subs {
        if about.is_empty() {
            problems.push(format!(
                "subcommand {sub} has no description (doc comment) in --help"
            ));
        }
    }
    if subs.iter().any(|(s, _)| s == "generate") {
        problems.push("a subcommand `generate` would be shadowed by the hidden one".into());
    }

    output(Process::new(bin).arg("generate").arg("man").arg(out))?;
    let got: BTreeSet<String> = std::fs::read_dir(out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let mut want: BTreeSet<String> = subs
        .iter()
        .map(|(s, _)| format!("{name}-{s}.{section}"))
        .collect();
    want.insert(format!("{name}.{section}"));
    if got != want {
        problems.push(format!("man pages: want {want:?}, got {got:?}"));
    }

    if which("man") {
        for page in &got {
            match render_man_page(&out.join(page)) {
                Ok(text) => {
                    if *page == format!("{name}.{section}") {
                        for (sub, _) in &subs {
                            let reference = format!("{name}-{sub}({section})");
                            if !text.contains(&reference) {
                                problems.push(format!("{page} does not name {reference}"));
                            }
                        }
                    }
                }
                Err(e) => problems.push(e),
            }
        }
    } else {
        problems.push(
            "`man` not found: install man-db (tests/vm/setup-host.sh does) to check the pages"
                .into(),
        );
    }

    for shell in ["bash", "zsh", "fish"] {
        let script = output(Process::new(bin).args(["generate", "completion", shell]))?;
        let words: BTreeSet<&str> = script
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .collect();
        for (sub, _) in &subs {
            if !words.contains(sub.as_str()) {
                problems.push(format!("{shell} completion does not mention {sub}"));
            }
        }
        if words.contains("generate") {
            problems.push(format!(
                "{shell} completion offers the hidden `generate` subcommand"
            ));
        }
        // Syntax, where the shell is installed (CI has only bash, which
        // also completes for real below).
        let syntax_check: &[&str] = match shell {
            "zsh" => &["-n"],
            "fish" => &["--no-execute"],
            _ => &[],
        };
        if !syntax_check.is_empty() && which(shell) {
            let file = out.with_extension(format!("{shell}-completion"));
            if let Err(e) = std::fs::write(&file, &script) {
                problems.push(format!("{}: {e}", file.display()));
            } else if let Err(e) = output(Process::new(shell).args(syntax_check).arg(&file)) {
                problems.push(format!("{shell} rejects its completion script: {e}"));
            }
        }
        if shell == "bash" {
            match bash_complete(&name, &script) {
                Ok(offered) => {
                    for (sub, _) in &subs {
                        if !offered.contains(sub) {
                            problems.push(format!(
                                "bash does not complete `{name} ` to {sub} (offers {offered:?})"
                            ));
                        }
                    }
                }
                Err(e) => problems.push(e),
            }
        }
    }

    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Renders a page as `man` shows it at 80 columns; an error carries every
/// warning `man --warnings` (groff `-ww`) printed.
pub fn render_man_page(page: &Path) -> Result<String, String> {
    let out = Process::new("man")
        .args(["--warnings", "-E", "UTF-8", "-l"])
        .arg(page)
        .env("MANWIDTH", "80")
        .env("LC_ALL", "C.UTF-8")
        .env_remove("MANPAGER")
        .env_remove("PAGER")
        .output()
        .map_err(|e| format!("man: {e}"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !stderr.trim().is_empty() {
        return Err(format!(
            "man --warnings -l {}: {}{stderr}",
            page.display(),
            out.status
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `(name, description)` entries of the "Commands:" list in clap's
/// help, without clap's own `help`.
fn subcommands_in_help(help: &str) -> Vec<(String, String)> {
    help.lines()
        .skip_while(|l| l.trim_end() != "Commands:")
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        // An entry is indented by two; its continuation lines by more.
        .filter(|l| l.starts_with("  ") && !l[2..].starts_with(' '))
        .filter_map(|l| {
            let l = l.trim();
            let (sub, about) = l.split_once(' ').unwrap_or((l, ""));
            (sub != "help").then(|| (sub.to_owned(), about.trim().to_owned()))
        })
        .collect()
}

/// What bash offers for `NAME <TAB>` with `script` loaded.
fn bash_complete(name: &str, script: &str) -> Result<BTreeSet<String>, String> {
    let driver = format!(
        "{script}\n\
         spec=$(complete -p {name}) || exit 1\n\
         func=$(printf '%s\\n' \"$spec\" | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')\n\
         COMP_WORDS=({name} ''); COMP_CWORD=1; COMP_LINE='{name} '; COMP_POINT=${{#COMP_LINE}}\n\
         \"$func\" {name} '' {name}\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n"
    );
    let out = output(Process::new("bash").args(["--norc", "--noprofile", "-c", &driver]))?;
    Ok(out.split_whitespace().map(str::to_owned).collect())
}

fn which(prog: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(prog).is_file()))
        .unwrap_or(false)
}

fn output(cmd: &mut Process) -> Result<String, String> {
    let shown = format!("{cmd:?}");
    let out = cmd.output().map_err(|e| format!("{shown}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{shown}: {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("{shown}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn help_subcommands_are_parsed_with_their_descriptions() {
        let help = "Block devices\n\nUsage: x <COMMAND>\n\nCommands:\n  \
                    run      Serve a volume\n  set      Change settings:\n           \
                    riops, wiops\n  bare\n  help     Print this message\n\n\
                    Options:\n  -h, --help  Print help\n";
        assert_eq!(
            subcommands_in_help(help),
            vec![
                ("run".to_owned(), "Serve a volume".to_owned()),
                ("set".to_owned(), "Change settings:".to_owned()),
                ("bare".to_owned(), String::new()),
            ]
        );
    }
}
