//! Man pages and shell completions for `ublk-nvmf`, `gimbal-target` and
//! `evol-arbiter`, rendered from each binary's own clap [`Command`].
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
//! `clap_mangen`, `clap_complete`) linked into every binary.
//!
//! `generate` is answered before clap parses the binary's own command line
//! and is not part of its `Command`: `clap_complete` offers hidden
//! subcommands too, and there is no removing one from a `Command`.
//!
//! [`check_binary`] is the binaries' test: every subcommand that `--help`
//! lists, nested ones (`evol-arbiter pool add`) included, must have a
//! description, a man page, an entry in its parent's page and in every
//! completion script, and every page must render without a warning from
//! `man --warnings`.

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
            let mut out = io::stdout().lock();
            out.write_all(completion(cmd, *shell).as_bytes())?;
            out.flush()
        }
    }
}

/// The completion script for `shell`, with clap_complete's bash script
/// repaired for a binary whose name has a hyphen (all of ours).
///
/// clap_complete (4.6.11, the newest) spells a subcommand's state in two
/// ways: the loop that reads the words typed escapes the binary's name
/// with `__` and the subcommands with `__subcmd__`
/// (`evol__arbiter__subcmd__pool`), the `case` arms that complete each
/// state escape the whole path at once, the name's hyphen too
/// (`evol__subcmd__arbiter__subcmd__pool`). No arm matches, so bash
/// completes nothing after a subcommand: not `evol-arbiter pool <TAB>`,
/// not `ublk-nvmf run --<TAB>` (upstream: clap-rs/clap issue 6421). The
/// arms are respelled as the loop spells them; once upstream is fixed
/// there is nothing to respell and this does nothing.
fn completion(mut cmd: Command, shell: Shell) -> String {
    let name = cmd.get_name().to_owned();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, &name, &mut script);
    let script = String::from_utf8_lossy(&script).into_owned();
    const SEP: &str = "__subcmd__";
    if shell != Shell::Bash || !name.contains('-') {
        return script;
    }
    let arm = format!("{}{SEP}", name.replace('-', SEP));
    let state = format!("{}{SEP}", name.replace('-', "__"));
    script
        .lines()
        .map(|line| match line.trim_start().strip_prefix(&arm) {
            // An arm's label: `        evol__subcmd__arbiter__subcmd__pool)`.
            Some(rest) if rest.ends_with(')') && !rest.contains(' ') => {
                let indent = &line[..line.len() - line.trim_start().len()];
                format!("{indent}{state}{rest}\n")
            }
            _ => format!("{line}\n"),
        })
        .collect()
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
/// lists, and those their own `bin SUB --help` lists (recursively),
/// writing the pages into `out` (which must not hold other files):
///
/// - every subcommand has a description in `--help` (a doc comment);
/// - the man pages are exactly `bin.SECTION` and `bin-SUB.SECTION` for each
///   (`bin-SUB-SUBSUB.SECTION` for a nested one);
/// - every page names its subcommands' pages, `bin-SUB(SECTION)`;
/// - every page renders with `man --warnings` without a warning (needs
///   man-db, which `tests/vm/setup-host.sh` installs);
/// - the bash, zsh and fish completion scripts name every subcommand,
///   bash really completes them (`bin ` to each subcommand, `bin SUB ` to
///   each of SUB's), and zsh and fish, where installed, accept their
///   scripts' syntax.
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
    if subcommands_in_help(&help).is_empty() {
        return Err(format!("{name} --help lists no subcommands:\n{help}"));
    }
    // Every subcommand's path (["pool", "add"]), parents first.
    let tree = subcommand_tree(bin, &[])?;
    for (path, about) in &tree {
        if about.is_empty() {
            problems.push(format!(
                "subcommand {} has no description (doc comment) in --help",
                path.join(" ")
            ));
        }
    }
    if tree.iter().any(|(p, _)| p == &["generate"]) {
        problems.push("a subcommand `generate` would be shadowed by the hidden one".into());
    }
    // The page of a command path: `bin`, `bin-pool`, `bin-pool-add`.
    let page_name = |path: &[String]| {
        std::iter::once(name.as_str())
            .chain(path.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join("-")
    };

    output(Process::new(bin).arg("generate").arg("man").arg(out))?;
    let got: BTreeSet<String> = std::fs::read_dir(out)
        .map_err(|e| format!("{}: {e}", out.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    let mut want: BTreeSet<String> = tree
        .iter()
        .map(|(p, _)| format!("{}.{section}", page_name(p)))
        .collect();
    want.insert(format!("{name}.{section}"));
    if got != want {
        problems.push(format!("man pages: want {want:?}, got {got:?}"));
    }

    if which("man") {
        for page in &got {
            match render_man_page(&out.join(page)) {
                Ok(text) => {
                    // The children of the command this page is about.
                    for (path, _) in &tree {
                        let parent = format!("{}.{section}", page_name(&path[..path.len() - 1]));
                        let reference = format!("{}({section})", page_name(path));
                        if *page == parent && !text.contains(&reference) {
                            problems.push(format!("{page} does not name {reference}"));
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
        for (path, _) in &tree {
            let sub = path.last().expect("a subcommand path is not empty");
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
            // `bin `, then `bin SUB ` for every SUB with subcommands.
            let parents = std::iter::once(&[][..]).chain(
                tree.iter().map(|(p, _)| p.as_slice()).filter(|p| {
                    tree.iter()
                        .any(|(c, _)| c.len() == p.len() + 1 && c.starts_with(p))
                }),
            );
            for parent in parents {
                let line = std::iter::once(name.as_str())
                    .chain(parent.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(" ");
                match bash_complete(&name, parent, "", &script) {
                    Ok(offered) => {
                        let children = tree
                            .iter()
                            .filter(|(c, _)| c.len() == parent.len() + 1 && c.starts_with(parent));
                        for (child, _) in children {
                            let sub = &child[parent.len()];
                            if !offered.contains(sub) {
                                problems.push(format!(
                                    "bash does not complete `{line} ` to {sub} (offers {offered:?})"
                                ));
                            }
                        }
                    }
                    Err(e) => problems.push(e),
                }
            }
            // Each subcommand's own options: `bin SUB --` to `--help`.
            for (path, _) in &tree {
                match bash_complete(&name, path, "--", &script) {
                    Ok(offered) if offered.contains("--help") => {}
                    Ok(offered) => problems.push(format!(
                        "bash does not complete `{name} {} --` to --help (offers {offered:?})",
                        path.join(" ")
                    )),
                    Err(e) => problems.push(e),
                }
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

/// Every subcommand of `bin PREFIX...` with its description, recursively
/// (from each one's own `--help`): paths such as `["pool", "add"]`, each
/// parent before its children.
fn subcommand_tree(bin: &Path, prefix: &[String]) -> Result<Vec<(Vec<String>, String)>, String> {
    let help = output(Process::new(bin).args(prefix).arg("--help"))?;
    let mut tree = Vec::new();
    for (sub, about) in subcommands_in_help(&help) {
        let mut path = prefix.to_vec();
        path.push(sub);
        let children = subcommand_tree(bin, &path)?;
        tree.push((path, about));
        tree.extend(children);
    }
    Ok(tree)
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

/// What bash offers for `NAME WORDS... CUR<TAB>` with `script` loaded
/// (CUR: the start of the word being completed, possibly empty).
fn bash_complete(
    name: &str,
    words: &[String],
    cur: &str,
    script: &str,
) -> Result<BTreeSet<String>, String> {
    let typed: Vec<&str> = std::iter::once(name)
        .chain(words.iter().map(String::as_str))
        .collect();
    let line = typed.join(" ");
    let prev = typed.last().expect("the name at least");
    let driver = format!(
        "{script}\n\
         spec=$(complete -p {name}) || exit 1\n\
         func=$(printf '%s\\n' \"$spec\" | sed -n 's/.*-F \\([^ ]*\\).*/\\1/p')\n\
         COMP_WORDS=({line} '{cur}'); COMP_CWORD={cword}; COMP_LINE='{line} {cur}'; COMP_POINT=${{#COMP_LINE}}\n\
         \"$func\" {name} '{cur}' {prev}\n\
         printf '%s\\n' \"${{COMPREPLY[@]}}\"\n",
        cword = typed.len()
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
    fn bash_arms_are_spelled_as_the_loop_spells_a_hyphenated_name() {
        let cmd = || {
            Command::new("my-app").subcommand(
                Command::new("thunder")
                    .arg(clap::Arg::new("lightning").long("lightning"))
                    .subcommand(Command::new("roll-on")),
            )
        };
        let bash = completion(cmd(), Shell::Bash);
        for state in [
            "my__app__subcmd__thunder",
            "my__app__subcmd__thunder__subcmd__roll__subcmd__on",
        ] {
            assert!(bash.contains(&format!("cmd=\"{state}\"")), "{bash}");
            assert!(bash.contains(&format!("\n        {state})\n")), "{bash}");
        }
        assert!(!bash.contains("my__subcmd__app"), "{bash}");
        // Other shells, and names without a hyphen, as clap_complete writes them.
        let mut zsh = Vec::new();
        clap_complete::generate(Shell::Zsh, &mut cmd(), "my-app", &mut zsh);
        assert_eq!(completion(cmd(), Shell::Zsh).as_bytes(), zsh);
    }

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
