//! `ublk-nvmf add -t tcp -a ADDR -n NQN ...`: nvme-cli's connect options,
//! turned into the volume file they imply, so that a volume made in one
//! line is an ordinary volume afterwards (systemd's `ublk-nvmf@NAME` can
//! take it over from `/etc/ublk-nvmf/NAME.toml`).
//!
//! The options keep nvme-cli's names and meanings where ublk-nvmf has the
//! same notion: `--nr-io-queues` is the number of ublk queues (each with
//! its own NVMe/TCP I/O queue per priority class), `--queue-size` the
//! requests in flight per queue, `--ctrl-loss-tmo` / `--reconnect-delay` /
//! `--keep-alive-tmo` in seconds (-1: forever, as nvme-cli).

use std::fmt::Write as _;

/// nvme-cli's connect options, as given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConnectArgs {
    /// `-t/--transport`: only `tcp`.
    pub transport: String,
    /// `-a/--traddr`.
    pub traddr: String,
    /// `-s/--trsvcid` (default 4420).
    pub trsvcid: Option<u16>,
    /// `-n/--nqn`.
    pub nqn: String,
    /// `--nsid` (default 1; nvme-cli connects whole subsystems, a volume is
    /// one namespace).
    pub nsid: Option<u32>,
    /// `--name`: the volume name (default: from the NQN and NSID).
    pub name: Option<String>,
    /// `-i/--nr-io-queues`.
    pub nr_io_queues: Option<u16>,
    /// `-Q/--queue-size`.
    pub queue_size: Option<u16>,
    /// `-l/--ctrl-loss-tmo`, seconds, -1 forever.
    pub ctrl_loss_tmo: Option<i64>,
    /// `-c/--reconnect-delay`, seconds.
    pub reconnect_delay: Option<i64>,
    /// `-k/--keep-alive-tmo`, seconds.
    pub keep_alive_tmo: Option<i64>,
    /// `-q/--hostnqn`.
    pub hostnqn: Option<String>,
    /// `-I/--hostid`.
    pub hostid: Option<String>,
    /// `-g/--hdr-digest`.
    pub hdr_digest: bool,
    /// `-G/--data-digest`.
    pub data_digest: bool,
    /// `-S/--dhchap-secret`.
    pub dhchap_secret: Option<String>,
    /// `-C/--dhchap-ctrl-secret`.
    pub dhchap_ctrl_secret: Option<String>,
}

impl ConnectArgs {
    /// The volume name: `--name`, else the NQN's last `:` part (or the
    /// whole NQN) and the NSID, reduced to the characters a volume name
    /// may hold (`demo-1` for `nqn.2026-01.io.gimbal:demo`, NSID 1).
    pub fn volume_name(&self) -> String {
        if let Some(n) = &self.name {
            return n.clone();
        }
        let tail = self.nqn.rsplit(':').next().unwrap_or(&self.nqn);
        let mut name: String = tail
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || "_.-".contains(c) {
                    c
                } else {
                    '-'
                }
            })
            .collect();
        name = name.trim_start_matches('.').to_string();
        name.truncate(56);
        if name.is_empty() {
            name = "volume".into();
        }
        format!("{name}-{}", self.nsid.unwrap_or(1))
    }

    /// The volume file these options imply; every value is checked when
    /// the file is parsed like any other (`VolumeConfig::parse`), so an
    /// error names the option's key in it.
    pub fn to_toml(&self) -> Result<String, String> {
        if self.transport != "tcp" {
            return Err(format!(
                "transport `{}` is not supported: ublk-nvmf speaks NVMe/TCP (-t tcp)",
                self.transport
            ));
        }
        let mut t = String::new();
        let q = toml_string;
        let _ = writeln!(
            t,
            "# Written by `ublk-nvmf add -t tcp ...`; an ordinary volume file."
        );
        let _ = writeln!(t, "name = {}", q(&self.volume_name()));
        let _ = writeln!(t, "[target]");
        let _ = writeln!(t, "address = {}", q(&self.traddr));
        let _ = writeln!(t, "port = {}", self.trsvcid.unwrap_or(4420));
        let _ = writeln!(t, "subnqn = {}", q(&self.nqn));
        let _ = writeln!(t, "nsid = {}", self.nsid.unwrap_or(1));
        if self.hostnqn.is_some()
            || self.hostid.is_some()
            || self.dhchap_secret.is_some()
            || self.dhchap_ctrl_secret.is_some()
        {
            let _ = writeln!(t, "[host]");
            for (key, v) in [
                ("nqn", &self.hostnqn),
                ("id", &self.hostid),
                ("dhchap_secret", &self.dhchap_secret),
                ("dhchap_ctrl_secret", &self.dhchap_ctrl_secret),
            ] {
                if let Some(v) = v {
                    let _ = writeln!(t, "{key} = {}", q(v));
                }
            }
        }
        let _ = writeln!(t, "[io]");
        if let Some(n) = self.nr_io_queues {
            let _ = writeln!(t, "queues = {n}");
        }
        if let Some(n) = self.queue_size {
            let _ = writeln!(t, "queue_depth = {n}");
        }
        let _ = writeln!(t, "header_digest = {}", self.hdr_digest);
        let _ = writeln!(t, "data_digest = {}", self.data_digest);
        let _ = writeln!(t, "[reconnect]");
        for (key, v) in [
            ("ctrl_loss_tmo", self.ctrl_loss_tmo),
            ("reconnect_delay", self.reconnect_delay),
            ("keep_alive_tmo", self.keep_alive_tmo),
        ] {
            if let Some(v) = v {
                let _ = writeln!(t, "{key} = {v}");
            }
        }
        Ok(t)
    }
}

/// A TOML basic string holding `s` exactly.
fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{:04X}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::VolumeConfig;
    use std::path::Path;

    fn parse(text: &str) -> VolumeConfig {
        VolumeConfig::parse(Path::new("v.toml"), text).unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn the_one_liner_gives_the_same_volume_as_the_equivalent_file() {
        let args = ConnectArgs {
            transport: "tcp".into(),
            traddr: "127.0.0.1".into(),
            trsvcid: Some(4421),
            nqn: "nqn.2026-01.io.gimbal:demo".into(),
            nsid: Some(2),
            nr_io_queues: Some(2),
            queue_size: Some(32),
            ctrl_loss_tmo: Some(-1),
            reconnect_delay: Some(3),
            keep_alive_tmo: Some(7),
            hostnqn: Some(
                "nqn.2014-08.org.nvmexpress:uuid:2b1f6a4e-7c0d-4e5b-9a51-3f6f2d8c9e10".into(),
            ),
            hdr_digest: true,
            data_digest: true,
            ..ConnectArgs::default()
        };
        let written = parse(&args.to_toml().unwrap());
        let by_hand = parse(
            r#"
name = "demo-2"
[target]
address = "127.0.0.1"
port = 4421
subnqn = "nqn.2026-01.io.gimbal:demo"
nsid = 2
[host]
nqn = "nqn.2014-08.org.nvmexpress:uuid:2b1f6a4e-7c0d-4e5b-9a51-3f6f2d8c9e10"
[io]
queues = 2
queue_depth = 32
header_digest = true
data_digest = true
[reconnect]
ctrl_loss_tmo = -1
reconnect_delay = 3
keep_alive_tmo = 7
"#,
        );
        assert_eq!(written, by_hand);
        assert!(written.header_digest && written.data_digest);
        // Defaults: those of a file that gives only the target.
        let min = ConnectArgs {
            transport: "tcp".into(),
            traddr: "10.0.0.1".into(),
            nqn: "nqn.2026-01.io.x:a b".into(),
            ..ConnectArgs::default()
        };
        let written = parse(&min.to_toml().unwrap());
        let by_hand = parse(
            "name = \"a-b-1\"\n[target]\naddress = \"10.0.0.1\"\nsubnqn = \"nqn.2026-01.io.x:a b\"\n",
        );
        assert_eq!(written, by_hand);
    }

    #[test]
    fn bad_values_are_refused_by_the_file_checks() {
        let mut a = ConnectArgs {
            transport: "rdma".into(),
            traddr: "127.0.0.1".into(),
            nqn: "nqn.x:y".into(),
            ..ConnectArgs::default()
        };
        assert!(a.to_toml().unwrap_err().contains("-t tcp"));
        a.transport = "tcp".into();
        a.queue_size = Some(1);
        let e = VolumeConfig::parse(Path::new("v.toml"), &a.to_toml().unwrap()).unwrap_err();
        assert_eq!(e.field, "io.queue_depth", "{e}");
        // Quotes and backslashes survive as data.
        a.queue_size = None;
        a.traddr = "odd\"host\\".into();
        assert_eq!(parse(&a.to_toml().unwrap()).target.address, "odd\"host\\");
    }
}
