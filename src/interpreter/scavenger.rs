//! When a forked interpreter's allocator scavenger resumes: suspended in the zygote before it
//! forks, it resumes once the child's first call is over.

/// A forked worker's allocator scavenger (`fork_server::resume_scavenger`): suspended in the
/// zygote, it resumes once the child's first call is over. Not at once after that call's run
/// when the front takes a checkpoint next: the scavenger's first pass, on the other core,
/// slowed that checkpoint, and so the call's answer, by 1–3 ms on a 2-core machine.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Scavenger {
    /// Suspended since the fork, before the first run.
    Suspended,
    /// Suspended until the checkpoint that follows the first run.
    UntilCheckpoint,
    /// Running.
    Running,
}

/// A served request, as [`Scavenger::after`] tells them apart.
#[derive(Clone, Copy)]
pub(super) enum Step {
    /// A run; `checkpoint_follows` as the front said.
    Ran { checkpoint_follows: bool },
    /// A checkpoint.
    Checkpointed,
    /// Anything else.
    Other,
}

impl Scavenger {
    /// After `step` was served.
    pub(super) fn after(&mut self, step: Step) {
        let next = match (*self, step) {
            (Scavenger::Running, _) => return,
            (
                Scavenger::Suspended,
                Step::Ran {
                    checkpoint_follows: true,
                },
            ) => Scavenger::UntilCheckpoint,
            (Scavenger::Suspended, Step::Ran { .. })
            | (Scavenger::UntilCheckpoint, Step::Checkpointed | Step::Ran { .. }) => {
                super::fork_server::resume_scavenger();
                Scavenger::Running
            }
            (state, _) => state,
        };
        *self = next;
    }
}
