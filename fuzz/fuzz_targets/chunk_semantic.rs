#![no_main]

use lathe_text::chunk::Strategy;
use lathe_fuzz::{run, Case};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|case: Case| run(Strategy::Semantic, case));
