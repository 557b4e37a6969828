//! Hysteresis shared by every finding: a condition must hold for `raise_after` observations in a
//! row to fire and be absent for `clear_after` in a row to resolve, so one noisy sample neither
//! raises nor clears a finding.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Nothing to report.
    Quiet,
    /// Evidence building, not firing yet.
    Pending,
    /// Evidence gone before it fired.
    Dropped,
    Fired,
    /// Still firing (evidence refreshed).
    Firing,
    Resolved,
}

#[derive(Debug, Clone)]
pub struct Lifecycle {
    raise_after: u32,
    clear_after: u32,
    on: u32,
    off: u32,
    firing: bool,
}

impl Lifecycle {
    pub fn new(raise_after: u32, clear_after: u32) -> Self {
        Self {
            raise_after: raise_after.max(1),
            clear_after: clear_after.max(1),
            on: 0,
            off: 0,
            firing: false,
        }
    }

    pub fn is_firing(&self) -> bool {
        self.firing
    }

    pub fn step(&mut self, active: bool) -> Change {
        if active {
            self.off = 0;
            self.on = self.on.saturating_add(1);
            if self.firing {
                Change::Firing
            } else if self.on >= self.raise_after {
                self.firing = true;
                Change::Fired
            } else {
                Change::Pending
            }
        } else {
            let was_pending = self.on > 0 && !self.firing;
            self.on = 0;
            self.off = self.off.saturating_add(1);
            if self.firing {
                if self.off >= self.clear_after {
                    self.firing = false;
                    Change::Resolved
                } else {
                    Change::Firing
                }
            } else if was_pending {
                Change::Dropped
            } else {
                Change::Quiet
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_noisy_sample_neither_raises_nor_clears() {
        let mut l = Lifecycle::new(3, 3);
        let seq = [
            true, false, true, true, true, false, true, false, false, false,
        ];
        let got: Vec<Change> = seq.iter().map(|a| l.step(*a)).collect();
        use Change::*;
        assert_eq!(
            got,
            [Pending, Dropped, Pending, Pending, Fired, Firing, Firing, Firing, Firing, Resolved]
        );
    }
}
