//! What the commands that read a profile ask of it first (merged functions
//! and tree, samples, a diff, a merge), on every profile `read_profile`
//! accepts. A profile the reader accepts must be safe to use: this target
//! finds the ones that are not.

proftap_fuzz::target!(run);

fn run(data: &[u8]) {
    let file = proftap_fuzz::profile_file(data);
    let Ok(profile) = proftap_fuzz::with_file("fuzz.profile", &file, proftap_profile::read_profile) else { return };
    let _ = profile.merged_functions();
    let _ = profile.merged_tree().children();
    let _ = profile.total_calls();
    if let Some(samples) = &profile.samples {
        let _ = samples.functions();
    }
    let _ = (profile.own_times_after_throttle(), profile.own_times_untimed());
    for metric in &profile.metrics {
        let _ = proftap_profile::diff(&profile, &profile, metric, &proftap_profile::DiffOptions::default());
    }
    let _ = profile.clone().merge(&profile, false);
}
