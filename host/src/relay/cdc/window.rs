//! Which WAL position the slot may be told is done with: the end of the newest commit whose
//! rows, and every earlier commit's rows, are all settled (confirmed by the broker and marked
//! published, or parked). Commits arrive from the slot in commit order; their rows settle in
//! any order (different ordering keys publish concurrently).
//!
//! A commit is open from its `Begin` until its `Commit` message: its rows are admitted as
//! they are read, so a transaction larger than the relay's window never has to sit in memory
//! whole (the slot sends only committed transactions: pgoutput protocol 1 streams none in
//! progress). An open commit's end is not known yet, so the slot never moves past it.

use std::collections::{HashMap, VecDeque};

#[derive(Debug)]
struct Commit {
    /// `None` while the commit is open.
    end_lsn: Option<u64>,
    unsettled: usize,
}

/// The commits read from the slot and not yet reported to it.
#[derive(Debug, Default)]
pub struct CommitWindow {
    commits: VecDeque<Commit>,
    /// Row id → index of its commit, counted from the first commit ever pushed.
    rows: HashMap<i64, u64>,
    /// How many commits were popped off the front (index base of `commits`).
    popped: u64,
}

impl CommitWindow {
    /// A transaction began: the rows added next are its own, until [`CommitWindow::commit`].
    pub fn begin(&mut self) {
        self.commits.push_back(Commit {
            end_lsn: None,
            unsettled: 0,
        });
    }

    /// Row `id` of the open commit, to publish.
    pub fn add(&mut self, id: i64) {
        let Some(open) = self.commits.back_mut() else {
            return;
        };
        open.unsettled += 1;
        let index = self.popped + self.commits.len() as u64 - 1;
        self.rows.insert(id, index);
    }

    /// The open commit ended at `end_lsn`. Commits come in commit order, so `end_lsn` only
    /// grows.
    pub fn commit(&mut self, end_lsn: u64) {
        if let Some(open) = self.commits.back_mut() {
            open.end_lsn = Some(end_lsn);
        }
    }

    /// Row `id` is settled. Unknown ids (settled twice, or never pushed) are ignored.
    pub fn settle(&mut self, id: i64) {
        let Some(index) = self.rows.remove(&id) else {
            return;
        };
        let Some(offset) = index.checked_sub(self.popped) else {
            return;
        };
        if let Some(commit) = usize::try_from(offset)
            .ok()
            .and_then(|i| self.commits.get_mut(i))
        {
            commit.unsettled = commit.unsettled.saturating_sub(1);
        }
    }

    /// The end of the newest commit that is settled along with every commit before it, once:
    /// those commits leave the window. `None`: nothing new to report.
    pub fn advance(&mut self) -> Option<u64> {
        let mut done = None;
        while let Some(end) = self
            .commits
            .front()
            .filter(|c| c.unsettled == 0)
            .and_then(|c| c.end_lsn)
        {
            self.commits.pop_front();
            done = Some(end);
            self.popped += 1;
        }
        done
    }

    /// Rows read from the slot and not settled yet.
    pub fn rows_in_flight(&self) -> usize {
        self.rows.len()
    }

    /// Commits not yet reported, the open one included.
    pub fn commits(&self) -> usize {
        self.commits.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl CommitWindow {
        /// A whole commit at once.
        fn push(&mut self, end_lsn: u64, rows: &[i64]) {
            self.begin();
            for id in rows {
                self.add(*id);
            }
            self.commit(end_lsn);
        }
    }

    #[test]
    fn the_slot_advances_only_past_commits_settled_in_full_and_in_order() {
        let mut w = CommitWindow::default();
        w.push(100, &[1, 2]);
        w.push(200, &[3]);
        w.push(300, &[]);
        w.push(400, &[4, 5]);
        assert_eq!(w.rows_in_flight(), 5);
        // A later commit settled first: nothing may be reported yet.
        w.settle(3);
        assert_eq!(w.advance(), None);
        w.settle(1);
        assert_eq!(w.advance(), None, "row 2 of the first commit is still out");
        w.settle(2);
        // 100 and 200 are done, and the empty 300 with them; 400 waits for 4 and 5.
        assert_eq!(w.advance(), Some(300));
        assert_eq!(w.advance(), None, "reported once");
        w.settle(5);
        w.settle(5);
        w.settle(99);
        assert_eq!(w.advance(), None);
        w.settle(4);
        assert_eq!(w.advance(), Some(400));
        assert_eq!((w.commits(), w.rows_in_flight()), (0, 0));
        w.push(500, &[]);
        assert_eq!(w.advance(), Some(500), "a commit without outbox rows");
    }

    #[test]
    fn an_open_commit_holds_the_slot_even_when_its_rows_so_far_are_settled() {
        let mut w = CommitWindow::default();
        w.push(100, &[1]);
        w.begin();
        w.add(2);
        w.add(3);
        w.settle(1);
        w.settle(2);
        w.settle(3);
        // The second transaction's rows are all out, but more of it may still come.
        assert_eq!(w.advance(), Some(100));
        assert_eq!(w.advance(), None, "an open commit has no end to report");
        assert_eq!(w.commits(), 1);
        w.add(4);
        w.commit(200);
        assert_eq!(w.advance(), None, "row 4 came after the others settled");
        w.settle(4);
        assert_eq!(w.advance(), Some(200));
        assert_eq!((w.commits(), w.rows_in_flight()), (0, 0));
    }
}
