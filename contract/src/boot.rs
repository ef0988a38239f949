//! The trial-boot contract between GRUB and the device: the variables of
//! GRUB's environment block on the ESP that put a new default deployment on
//! trial and count its tries. The builder's `grub.cfg` (the disk stage)
//! counts them down before each boot; the device's health check reads and
//! resets them after one.

/// Where the environment block lives, relative to the ESP's root.
pub const GRUBENV_IN_ESP: &str = "EFI/BOOT/grubenv";

/// The GRUB environment variable that puts the default deployment on trial:
/// `1` while it has tries left, `fallback` once GRUB has given up on it.
pub const TRIAL_VAR: &str = "emberrtos_trial";
/// The tries the trial has left: one digit, counted down by GRUB.
pub const TRIES_VAR: &str = "emberrtos_tries";
/// The value of [`TRIAL_VAR`] after the last try failed.
pub const FALLBACK: &str = "fallback";
