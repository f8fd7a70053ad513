//! Each command's steps, declared once: a step's name is its variant's, and its doc comment is
//! what the book's reference page says of it. Progress events (`-o json`, `-v`), the User-Agent
//! of every request a step sends and `docs/src/reference/steps.md` take the names from here, so
//! that no table of names can drift from the steps the planners return.

/// Whose step it is: the command a progress event or a request's User-Agent names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Of {
    Move,
    /// `handoff move --all-namespaces`.
    WholeMove,
    Backup,
    Restore,
    WindowOpen,
    WindowClose,
}

impl Of {
    /// As progress events and User-Agents spell it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Of::Move => "move",
            Of::WholeMove => "move -A",
            Of::Backup => "backup",
            Of::Restore => "restore",
            Of::WindowOpen => "window open",
            Of::WindowClose => "window close",
        }
    }
}

/// A step's name, with what the declaration says of it.
pub trait StepName: Copy + Eq + std::fmt::Debug + 'static {
    /// Every step of the command, in the declaration's order.
    const ALL: &'static [Self];
    fn as_str(self) -> &'static str;
    /// The declaration's doc comment, lines joined.
    fn doc(self) -> &'static str;
}

/// Declares a command's step enum (each variant with its doc comment and its data, as a plain
/// enum would have them) and, beside it, the enum of its names (`names Name`), with
/// `Step::name()`. `names enum Name { .. }` alone declares names for a command whose steps carry
/// no data.
macro_rules! steps {
    (
        $(#[$attr:meta])*
        $vis:vis enum $Step:ident names $Name:ident {
            $(
                $(#[doc = $doc:literal])*
                $V:ident
                $( ( $($t:ty),* $(,)? ) )?
                $( { $( $(#[$fattr:meta])* $f:ident : $ft:ty ),* $(,)? } )?
            ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        $vis enum $Step {
            $(
                $(#[doc = $doc])*
                $V
                $( ( $($t),* ) )?
                $( { $( $(#[$fattr])* $f : $ft ),* } )?
            ),*
        }

        $crate::window::plan::declare::steps! {
            #[doc = concat!("The names of [`", stringify!($Step), "`]'s variants.")]
            $vis names enum $Name { $( $(#[doc = $doc])* $V ),* }
        }

        impl $Step {
            /// Its name, as progress events and User-Agents give it.
            pub fn name(&self) -> $Name {
                match self {
                    $( $Step::$V { .. } => $Name::$V ),*
                }
            }
        }
    };
    (
        $(#[$attr:meta])*
        $vis:vis names enum $Name:ident {
            $( $(#[doc = $doc:literal])* $V:ident ),* $(,)?
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        $vis enum $Name {
            $( $(#[doc = $doc])* $V ),*
        }

        impl $crate::window::plan::declare::StepName for $Name {
            const ALL: &'static [$Name] = &[$($Name::$V),*];

            fn as_str(self) -> &'static str {
                match self {
                    $( $Name::$V => stringify!($V) ),*
                }
            }

            fn doc(self) -> &'static str {
                match self {
                    $( $Name::$V => concat!($($doc, "\n"),*) ),*
                }
            }
        }
    };
}

pub(crate) use steps;

#[cfg(test)]
mod tests {
    use super::*;

    steps! {
        #[derive(Debug, Clone, PartialEq, Eq)]
        enum Example names ExampleName {
            /// A unit step,
            /// on two lines.
            Plain,
            /// A tuple step.
            Tuple(usize, String),
            /// A struct step.
            Struct {
                /// A field's own doc.
                cluster: usize,
                why: String,
            },
        }
    }

    #[test]
    fn a_declared_step_is_named_and_documented_by_its_variant() {
        assert_eq!(Example::Plain.name(), ExampleName::Plain);
        assert_eq!(Example::Tuple(1, "x".into()).name().as_str(), "Tuple");
        let s = Example::Struct {
            cluster: 0,
            why: String::new(),
        };
        assert_eq!(s.name(), ExampleName::Struct);
        assert_eq!(
            ExampleName::ALL,
            &[ExampleName::Plain, ExampleName::Tuple, ExampleName::Struct]
        );
        assert_eq!(ExampleName::Plain.doc(), " A unit step,\n on two lines.\n");
        assert_eq!(ExampleName::Struct.doc(), " A struct step.\n");
    }
}
