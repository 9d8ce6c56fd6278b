fn main() { eprintln!("xtask: nothing yet"); }
