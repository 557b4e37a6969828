//! The Processes table's columns: titles, widths, which survive a narrow terminal, and the
//! order sorting steps through.

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Column {
    Node,
    Gpu,
    Pid,
    User,
    Container,
    Name,
    Used,
    Floor,
    Peak,
    Reserved,
    Frag,
    Outside,
    Retries,
    Step,
    Findings,
}

impl Column {
    /// Display order, left to right.
    pub const ALL: [Column; 15] = [
        Column::Node,
        Column::Gpu,
        Column::Pid,
        Column::User,
        Column::Container,
        Column::Name,
        Column::Used,
        Column::Floor,
        Column::Peak,
        Column::Reserved,
        Column::Frag,
        Column::Outside,
        Column::Retries,
        Column::Step,
        Column::Findings,
    ];

    /// Which columns survive a narrow terminal, first to last.
    pub const BY_PRIORITY: [Column; 15] = [
        Column::Node,
        Column::Gpu,
        Column::Pid,
        Column::Name,
        Column::Used,
        Column::Findings,
        Column::Floor,
        Column::Step,
        Column::Peak,
        Column::Reserved,
        Column::Frag,
        Column::Retries,
        Column::Outside,
        Column::User,
        Column::Container,
    ];

    pub fn title(self) -> &'static str {
        match self {
            Column::Node => "NODE",
            Column::Gpu => "GPU",
            Column::Pid => "PID (NS)",
            Column::User => "USER",
            Column::Container => "CONTAINER",
            Column::Name => "PROCESS / JOB",
            Column::Used => "NVML USED",
            Column::Floor => "FLOOR",
            Column::Peak => "PEAK",
            Column::Reserved => "RESERVED",
            Column::Frag => "FRAG",
            Column::Outside => "OUTSIDE",
            Column::Retries => "RETRY",
            Column::Step => "STEP",
            Column::Findings => "FINDINGS",
        }
    }

    /// Width in cells; `Name` takes what is left over, at least this.
    pub fn width(self) -> u16 {
        match self {
            Column::Node => 12,
            Column::Gpu => 4,
            Column::Pid => 12,
            Column::User => 10,
            Column::Container => 12,
            Column::Name => 14,
            Column::Used | Column::Floor | Column::Peak | Column::Reserved | Column::Outside => 10,
            Column::Frag | Column::Retries => 5,
            Column::Step => 7,
            Column::Findings => 10,
        }
    }

    pub fn numeric(self) -> bool {
        !matches!(
            self,
            Column::Node
                | Column::User
                | Column::Container
                | Column::Name
                | Column::Findings
                | Column::Pid
        )
    }

    pub(super) fn index(self) -> usize {
        Column::ALL.iter().position(|c| *c == self).unwrap_or(0)
    }

    pub fn next(self) -> Column {
        Column::ALL[(self.index() + 1) % Column::ALL.len()]
    }
}
