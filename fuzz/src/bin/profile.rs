//! The profile reader (`read_profile`) on any bytes: header, gzip, JSON, the
//! model's types.

proftap_fuzz::target!(run);

fn run(data: &[u8]) {
    let file = proftap_fuzz::profile_file(data);
    let _ = proftap_fuzz::with_file("fuzz.profile", &file, proftap_profile::read_profile);
}
