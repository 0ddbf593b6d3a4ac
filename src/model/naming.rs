//! Names of the environment variables the env-vars strategy writes: `STAKATER_<NAME>_<TYPE>`,
//! exactly as stakater/Reloader forms them, so migrating users keep their variables.

use crate::model::source::SourceKind;

/// The prefix of every variable the env-vars strategy owns.
pub const ENV_VAR_PREFIX: &str = "STAKATER_";

/// Upper-cases `name` and turns every run of characters outside `[A-Z0-9]` that follows a kept
/// character into one `_`; leading junk is dropped, a trailing run still gives one `_`.
/// (`my-config.v2` → `MY_CONFIG_V2`, `-a--b-` → `A_B_`.)
pub fn mangle(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut last_kept = false;
    for c in name.chars().flat_map(char::to_uppercase) {
        if c.is_ascii_uppercase() || c.is_ascii_digit() {
            out.push(c);
            last_kept = true;
        } else {
            if last_kept {
                out.push('_');
            }
            last_kept = false;
        }
    }
    out
}

/// `STAKATER_<mangled name>_<CONFIGMAP|SECRET|SECRETPROVIDERCLASS>`.
pub fn env_var_name(kind: SourceKind, name: &str) -> String {
    format!("{ENV_VAR_PREFIX}{}_{}", mangle(name), kind.env_suffix())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mangling_table() {
        let cases = [
            ("my-config.v2", "MY_CONFIG_V2"),
            ("app", "APP"),
            ("App-Settings", "APP_SETTINGS"),
            ("a--b", "A_B"),
            ("-leading", "LEADING"),
            ("..a.b", "A_B"),
            ("trailing-", "TRAILING_"),
            ("x.-_y", "X_Y"),
            ("123", "123"),
            ("", ""),
        ];
        for (input, want) in cases {
            assert_eq!(mangle(input), want, "mangle({input:?})");
        }
    }

    #[test]
    fn full_names_per_kind() {
        assert_eq!(
            env_var_name(SourceKind::ConfigMap, "app-config"),
            "STAKATER_APP_CONFIG_CONFIGMAP"
        );
        assert_eq!(env_var_name(SourceKind::Secret, "db.creds"), "STAKATER_DB_CREDS_SECRET");
        assert_eq!(
            env_var_name(SourceKind::SecretProviderClass, "vault"),
            "STAKATER_VAULT_SECRETPROVIDERCLASS"
        );
    }

    #[test]
    fn different_names_can_collide() {
        assert_eq!(
            env_var_name(SourceKind::ConfigMap, "my-config"),
            env_var_name(SourceKind::ConfigMap, "my.config")
        );
    }
}
