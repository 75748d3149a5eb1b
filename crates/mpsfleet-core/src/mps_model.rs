//! What one GPU's MPS control daemon and its server do, as a pure model: the one the agent's
//! model mode (`mpsfleet-agent`'s `mps/model.rs`, behind the `MpsControl` seam) and the
//! simulator's world both run. It says what MPS does, not what the agent decides about it
//! (that is [`crate::lifecycle::mps`]).
//!
//! The rules, as `mps-facts.md` has them for the real daemon:
//! - a daemon that is down answers nothing and has no server; a hung one (SIGSTOP, a stuck
//!   driver call) is alive but every command and every probe times out;
//! - the daemon starts its server for the first client; a server in FAULT (a fatal exception
//!   of one client) refuses new clients and exits once its last client is gone;
//! - a daemon that exits takes its server, and so its clients' connections, with it.
//!
//! Who the clients are stays with the caller (process ids in the agent's model, tasks in the
//! simulator): it tells the model when the last one is gone.

/// The control daemon's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Process {
    Down,
    Answering,
    /// Alive, but nothing it is asked is answered.
    Hung,
}

/// The daemon's MPS server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    /// None started yet (no client since the daemon started), or it exited.
    None,
    Active,
    /// A client's fatal exception: new clients are refused until the last one is gone.
    Fault,
}

/// Why a client cannot connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// No daemon: a real CUDA program would run without MPS and without its limits.
    NoDaemon,
    Hung,
    Fault,
}

/// What a probe of the daemon finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// No daemon process.
    NoDaemon,
    /// The daemon does not answer within the probe's timeout.
    TimedOut,
    /// It answers, and its server is in FAULT.
    ServerFault,
    Ok,
}

/// One GPU's MPS control daemon and its server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Daemon {
    process: Process,
    server: Server,
}

impl Default for Daemon {
    fn default() -> Self {
        Daemon::down()
    }
}

impl Daemon {
    /// A daemon not started (or gone).
    pub fn down() -> Daemon {
        Daemon { process: Process::Down, server: Server::None }
    }

    pub fn process(&self) -> Process {
        self.process
    }

    pub fn server(&self) -> Server {
        self.server
    }

    /// Its process runs, answering or not.
    pub fn alive(&self) -> bool {
        self.process != Process::Down
    }

    /// It answers commands.
    pub fn answers(&self) -> bool {
        self.process == Process::Answering
    }

    /// It starts (again): answering, with no server until a client comes. `hung`: it hangs
    /// at once (a driver call that never returns).
    pub fn start(&mut self, hung: bool) {
        self.process = if hung { Process::Hung } else { Process::Answering };
        self.server = Server::None;
    }

    /// It exits (or is killed), and its server with it. True when it was alive.
    pub fn exit(&mut self) -> bool {
        let was = self.alive();
        *self = Daemon::down();
        was
    }

    /// It stops answering (SIGSTOP); a daemon that is down stays down.
    pub fn hang(&mut self) {
        if self.process == Process::Answering {
            self.process = Process::Hung;
        }
    }

    /// It answers again (SIGCONT).
    pub fn resume(&mut self) {
        if self.process == Process::Hung {
            self.process = Process::Answering;
        }
    }

    /// A client asks to connect: the server is started for the first one. The caller counts
    /// the clients (and their limit).
    pub fn connect(&mut self) -> Result<(), Refused> {
        match (self.process, self.server) {
            (Process::Down, _) => Err(Refused::NoDaemon),
            (Process::Hung, _) => Err(Refused::Hung),
            (Process::Answering, Server::Fault) => Err(Refused::Fault),
            (Process::Answering, _) => {
                self.server = Server::Active;
                Ok(())
            }
        }
    }

    /// The server is started without a client (`start_server`), if it is not running.
    pub fn start_server(&mut self) {
        if self.alive() && self.server == Server::None {
            self.server = Server::Active;
        }
    }

    /// A client's fatal exception puts the running server in FAULT. True when it did.
    pub fn fault(&mut self) -> bool {
        let faulted = self.alive() && self.server != Server::None;
        if faulted {
            self.server = Server::Fault;
        }
        faulted
    }

    /// The last client is gone: a server in FAULT exits. True when it did.
    pub fn last_client_gone(&mut self) -> bool {
        let ends = self.server == Server::Fault;
        if ends {
            self.server = Server::None;
        }
        ends
    }

    /// The server exits (shut down, or killed).
    pub fn end_server(&mut self) {
        self.server = Server::None;
    }

    /// What a probe finds.
    pub fn probe(&self) -> Probe {
        match (self.process, self.server) {
            (Process::Down, _) => Probe::NoDaemon,
            (Process::Hung, _) => Probe::TimedOut,
            (Process::Answering, Server::Fault) => Probe::ServerFault,
            (Process::Answering, _) => Probe::Ok,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_faulted_server_refuses_clients_until_its_last_client_is_gone() {
        let mut d = Daemon::down();
        assert_eq!(d.connect(), Err(Refused::NoDaemon));
        assert!(!d.fault(), "no daemon, no server to fault");
        d.start(false);
        assert!(!d.fault(), "no server before the first client");
        assert_eq!(d.connect(), Ok(()));
        assert!(d.fault());
        assert_eq!(d.probe(), Probe::ServerFault);
        assert_eq!(d.connect(), Err(Refused::Fault));
        assert!(d.last_client_gone());
        assert_eq!(d.server(), Server::None);
        assert_eq!(d.probe(), Probe::Ok);
        assert_eq!(d.connect(), Ok(()), "a new server for the next client");
        assert!(!d.last_client_gone(), "an active server stays without clients");
    }

    #[test]
    fn a_hung_daemon_answers_nothing_and_an_exit_takes_the_server() {
        let mut d = Daemon::down();
        d.hang();
        assert_eq!(d.process(), Process::Down, "a daemon that is down does not hang");
        d.start(false);
        d.connect().unwrap();
        d.hang();
        assert!(d.alive() && !d.answers());
        assert_eq!((d.probe(), d.connect()), (Probe::TimedOut, Err(Refused::Hung)));
        d.resume();
        assert_eq!(d.probe(), Probe::Ok);
        assert!(d.exit());
        assert_eq!((d.server(), d.probe()), (Server::None, Probe::NoDaemon));
        assert!(!d.exit(), "already down");
        d.start(true);
        assert_eq!(d.probe(), Probe::TimedOut, "started hung");
    }
}
