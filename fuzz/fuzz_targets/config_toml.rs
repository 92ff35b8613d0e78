//! The config file: any text either loads and then validates or not, or is rejected with a message;
//! never a panic.

#![no_main]

use lathe::config::Config;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml(text) {
        Err(error) => assert!(!error.to_string().is_empty()),
        Ok(config) => {
            let _ = config.validate();
        }
    }
});
