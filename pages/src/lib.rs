//! vsnap's page server: places a restored tree's memory with several
//! threads, where CRIU alone copies it with one.
//!
//! With `lazy-pages` in its config, CRIU restores everything but the pages
//! of private anonymous memory (what an engine's heap and weights are): each
//! restored task registers those ranges with a userfaultfd and CRIU hands
//! the descriptor to a server listening on `lazy-pages.socket` in its work
//! folder (`criu/uffd.c`: per task an `int` pid then the fd with one byte;
//! a negative pid for a zombie; `RESTORE_FINISHED` once every task is in
//! place). This server reads each task's pagemap and pages from the
//! artifact's own images and fills every range with `UFFDIO_COPY` from
//! `threads` threads once the restore finished, serving any page a task
//! touches before that at once.
//!
//! It also verifies the pages files: each thread takes a 64 MiB chunk,
//! reads it in pieces, hashes each piece and places its lazy pages from
//! the same buffer, then checks the chunk's digest from the manifest. Every
//! byte is read once, hashed once and copied once, on every core; a damaged
//! chunk fails the restore before anything of the tree has run.
//!
//! The tree stays stopped meanwhile (CRIU's `leave-stopped`, as for every
//! CPU restore): no task runs, forks, unmaps or discards memory before all
//! its pages are in, so the server never has to follow a changing address
//! space. An event other than a page fault is therefore an error, and so
//! is any range that could not be filled: a registered range left empty
//! would read as zeros once the descriptor is closed.
//!
//! - `plan`: what a restore's server is to do, decided before CRIU starts;
//! - `protocol`: CRIU's side of the socket;
//! - `task`: a restored task read from its images, and the pages files of
//!   an image folder;
//! - `place`: early faults and the poll over the tasks; `uffd`: the
//!   userfaultfd calls themselves;
//! - `huge`: the VMAs eligible for huge pages, unregistered and written
//!   through the kernel's fault path instead;
//! - `huge_free`: which of them go huge now (`huge_pages`: while the
//!   host's free 2 MiB blocks cover them, always, or never);
//! - `verify`: the pages files read chunk by chunk against their digests;
//! - `server`: the server's thread; `fill`: the fillers; `chunks`: the
//!   chunks they take, read piece by piece;
//! - `share`: several restores of one artifact sharing the reading and
//!   hashing of its pages (a leader, followers);
//! - `budget`: the host's filler slots, shared by every restore's server;
//! - `outcome`: what was placed; `error`: why not;
//! - `images`: the little of CRIU's image format the server reads;
//! - `stream`: a restore that starts while its artifact still arrives
//!   from a registry: what must be in place before CRIU starts;
//!   `arrivals`: the bytes its fillers and early faults wait for;
//! - `zero_pages`: a capture's all-zero pages left out of its images, as
//!   holes the server answers with zero pages;
//! - `criu_view`: where the pages files are sealed at rest, the images
//!   CRIU restores from, with the pages it reads itself in clear (the
//!   fillers open the rest as they read it).
//!
//! The shim is its one user in production (its restore preflight makes a
//! [`PagePlan`], its restore starts a [`PageServer`] with it, its capture
//! elides zero pages); the probes of `tests/examples` run the fill's own
//! pieces ([`chunks`], [`uffd`]) outside CRIU.

mod arrivals;
mod budget;
pub mod chunks;
mod criu_view;
mod error;
mod fill;
mod huge;
mod huge_free;
mod images;
mod outcome;
mod place;
mod plan;
mod protocol;
mod server;
mod share;
mod stream;
mod task;
#[cfg(test)]
mod testing;
pub mod uffd;
mod verify;
pub mod zero_pages;

pub use arrivals::{Arrivals, Failure};
pub use budget::MAX_SLOTS as MAX_FILLERS;
pub use criu_view::CriuView;
pub use error::{PageError, Phase};
pub use outcome::Placed;
pub use plan::{FillerBudget, PagePlan};
pub use server::PageServer;
pub use share::Sharing;
pub use stream::lazy_spans;
pub use verify::Verification;
/// The runtime config's `huge_pages` policy, a plan's `huge`.
pub use vsnap_config::HugePages;
