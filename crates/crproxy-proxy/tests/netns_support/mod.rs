//! Two network namespaces of the test's own, joined by a veth pair, so that a
//! test can make a host go silent the way loopback never does: a node powered
//! off or a route dropped sends no FIN and no reset, and its kernel stops
//! answering even TCP keepalive probes.
//!
//! The client side is `10.213.0.1`, the server side `10.213.0.2`; both exist
//! only inside the namespaces, which are deleted (with their veth ends) when the
//! [`Namespaces`] drops. Needs iproute2's `ip` and the right to make namespaces
//! (root); [`Namespaces::create`] says so when either is missing.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::process::Command;

/// The client namespace's address.
pub const CLIENT_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 1);
/// The server namespace's address.
pub const SERVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 213, 0, 2);
/// The veth ends' link addresses, fixed so that each side knows the other's
/// for good (see [`Namespaces::create`]).
const CLIENT_MAC: &str = "02:00:0a:d5:00:01";
const SERVER_MAC: &str = "02:00:0a:d5:00:02";

/// A client and a server namespace, named after this process so that concurrent
/// runs do not meet.
pub struct Namespaces {
    pub client: String,
    pub server: String,
}

impl Namespaces {
    /// Makes both namespaces, the veth pair between them and their loopbacks.
    /// Each side knows the other's link address permanently, so no ARP runs:
    /// once the server is silenced, a client's neighbour entry that timed out
    /// could otherwise fail its next connect with "no route to host" instead of
    /// leaving it unanswered, and a host with reverse-path filtering on would
    /// drop the ARP requests too. `Err` names the command that failed and what
    /// it printed.
    pub fn create() -> Result<Namespaces, String> {
        let pid = std::process::id();
        let namespaces = Namespaces {
            client: format!("crproxy-{pid}-client"),
            server: format!("crproxy-{pid}-server"),
        };
        let (client, server) = (namespaces.client.as_str(), namespaces.server.as_str());
        let client_cidr = format!("{CLIENT_ADDR}/30");
        let server_cidr = format!("{SERVER_ADDR}/30");
        // Left behind by a run of this process id that was killed: made again.
        for namespace in [client, server] {
            let _ = Command::new("ip")
                .args(["netns", "del", namespace])
                .output();
        }
        // Dropped on an early return, so a half-made pair is deleted too.
        ip(&["netns", "add", client])?;
        ip(&["netns", "add", server])?;
        ip(&[
            "link", "add", "veth0", "netns", client, "address", CLIENT_MAC, "type", "veth", "peer",
            "name", "veth0", "netns", server, "address", SERVER_MAC,
        ])?;
        ip(&["-n", client, "addr", "add", &client_cidr, "dev", "veth0"])?;
        ip(&["-n", server, "addr", "add", &server_cidr, "dev", "veth0"])?;
        for namespace in [client, server] {
            ip(&["-n", namespace, "link", "set", "lo", "up"])?;
            ip(&["-n", namespace, "link", "set", "veth0", "up"])?;
        }
        for (namespace, other_addr, other_mac) in [
            (client, SERVER_ADDR, SERVER_MAC),
            (server, CLIENT_ADDR, CLIENT_MAC),
        ] {
            let other_addr = other_addr.to_string();
            ip(&[
                "-n",
                namespace,
                "neigh",
                "replace",
                &other_addr,
                "lladdr",
                other_mac,
                "dev",
                "veth0",
                "nud",
                "permanent",
            ])?;
        }
        Ok(namespaces)
    }

    /// Moves the calling thread into `namespace`: every socket it makes from now
    /// on lives there (a socket keeps its namespace whichever thread uses it).
    pub fn enter(namespace: &str) -> Result<(), String> {
        let path = format!("/var/run/netns/{namespace}");
        let file = std::fs::File::open(&path).map_err(|e| format!("open {path}: {e}"))?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&file),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )
        .map_err(|e| format!("setns {path}: {e}"))
    }

    /// The server's kernel stops answering the client: every packet it would
    /// send there (an ACK, a keepalive answer, a SYN-ACK) is discarded without a
    /// word. (With reverse-path filtering on, the client's packets are dropped
    /// on arrival as well; silent either way.)
    pub fn silence_server(&self) -> Result<(), String> {
        ip(&[
            "-n",
            &self.server,
            "route",
            "add",
            "blackhole",
            &format!("{CLIENT_ADDR}/32"),
        ])
    }

    /// Undoes [`Namespaces::silence_server`].
    pub fn restore_server(&self) -> Result<(), String> {
        ip(&[
            "-n",
            &self.server,
            "route",
            "del",
            "blackhole",
            &format!("{CLIENT_ADDR}/32"),
        ])
    }
}

impl Drop for Namespaces {
    fn drop(&mut self) {
        for namespace in [&self.client, &self.server] {
            let _ = Command::new("ip")
                .args(["netns", "del", namespace])
                .output();
        }
    }
}

fn ip(args: &[&str]) -> Result<(), String> {
    let output = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
