//! The kubeconfig file format, the subset crproxy needs.
//!
//! Unknown keys (`preferences`, `extensions`, ...) are ignored rather than rejected
//! so kubeconfigs written by other tools load. What crproxy cannot honour (a legacy
//! `auth-provider`) is refused by name when a [`crate::ClusterConfig`] is built.

use crate::{Error, KubeconfigFileError, KubeconfigFileProblem};
use serde::{Deserialize, Deserializer, Serialize};
use std::path::{Path, PathBuf};

/// A parsed kubeconfig. Relative file paths inside it are resolved against `base_dir`
/// (the directory of the file it was loaded from) when a [`crate::ClusterConfig`] is
/// built from it.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct Kubeconfig {
    #[serde(default, deserialize_with = "null_default")]
    pub clusters: Vec<NamedCluster>,
    #[serde(default, deserialize_with = "null_default")]
    pub users: Vec<NamedUser>,
    #[serde(default, deserialize_with = "null_default")]
    pub contexts: Vec<NamedContext>,
    #[serde(
        rename = "current-context",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub current_context: Option<String>,
    /// Directory relative paths are resolved against; `None` means the process's
    /// working directory.
    #[serde(skip)]
    pub base_dir: Option<PathBuf>,
}

/// `clusters[]` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct NamedCluster {
    pub name: String,
    #[serde(default)]
    pub cluster: KubeCluster,
}

/// `clusters[].cluster`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub struct KubeCluster {
    #[serde(default)]
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub certificate_authority_data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_tls_verify: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_server_name: Option<String>,
}

/// `users[]` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct NamedUser {
    pub name: String,
    #[serde(default)]
    pub user: KubeUser,
}

/// `users[].user`. Key spellings follow kubectl (`tokenFile` is camelCase there).
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct KubeUser {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(rename = "tokenFile", default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    #[serde(
        rename = "client-certificate",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_certificate: Option<String>,
    #[serde(
        rename = "client-certificate-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_certificate_data: Option<String>,
    #[serde(
        rename = "client-key",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_key: Option<String>,
    #[serde(
        rename = "client-key-data",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub client_key_data: Option<String>,
    /// An exec credential plugin (client.authentication.k8s.io), run for a token
    /// or a client certificate; read as JSON here, checked when a
    /// [`crate::ClusterConfig`] is built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<serde_json::Value>,
    /// A legacy auth provider (gcp, oidc, ...). Not supported: kept only to say so
    /// clearly instead of silently connecting anonymously.
    #[serde(
        rename = "auth-provider",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub auth_provider: Option<serde_json::Value>,
}

/// `contexts[]` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct NamedContext {
    pub name: String,
    #[serde(default)]
    pub context: KubeContext,
}

/// `contexts[].context`.
#[derive(Clone, Debug, Default, Deserialize, Serialize, PartialEq)]
pub struct KubeContext {
    #[serde(default)]
    pub cluster: String,
    #[serde(default)]
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

impl Kubeconfig {
    /// Reads and parses a kubeconfig file; relative paths in it resolve against the
    /// file's directory.
    pub fn load(path: &Path) -> Result<Self, KubeconfigFileError> {
        let error = |problem| KubeconfigFileError {
            path: path.to_path_buf(),
            problem,
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| error(KubeconfigFileProblem::Unreadable(e.to_string())))?;
        let mut cfg = parse(&text).map_err(|e| error(KubeconfigFileProblem::Invalid(e)))?;
        cfg.base_dir = path.parent().map(Path::to_path_buf);
        Ok(cfg)
    }

    /// The kubeconfig kubectl would use: the first existing file in `$KUBECONFIG`
    /// (merging several files is not supported), else `$HOME/.kube/config`. `None`
    /// when there is none.
    pub fn load_default() -> Result<Option<Self>, KubeconfigFileError> {
        match default_path() {
            Some(p) => Self::load(&p).map(Some),
            None => Ok(None),
        }
    }

    /// Parses kubeconfig YAML (or JSON). Relative paths resolve against the working
    /// directory unless `base_dir` is set afterwards.
    pub fn from_yaml(text: &str) -> Result<Self, Error> {
        parse(text).map_err(Error::Kubeconfig)
    }

    /// The context named `name`, or the current context when `None`.
    pub fn context(&self, name: Option<&str>) -> Result<&NamedContext, Error> {
        let name = match name {
            Some(n) => n,
            None => self.current_context.as_deref().ok_or_else(|| {
                Error::Kubeconfig("no context given and current-context is not set".into())
            })?,
        };
        self.contexts
            .iter()
            .find(|c| c.name == name)
            .ok_or_else(|| Error::Kubeconfig(format!("context {name:?} not found")))
    }

    /// Resolves a path from the file against `base_dir`.
    pub fn resolve(&self, path: &str) -> PathBuf {
        let p = Path::new(path);
        match &self.base_dir {
            Some(base) if p.is_relative() => base.join(p),
            _ => p.to_path_buf(),
        }
    }
}

/// The kubeconfig in `text`, or what is wrong with it on one line (the parser's
/// own rendering spans several, with a source snippet).
fn parse(text: &str) -> Result<Kubeconfig, String> {
    serde_saphyr::from_str(text)
        .map_err(|e| format!("bad YAML: {}", crproxy_core::yaml_error::one_line(&e)))
}

fn default_path() -> Option<PathBuf> {
    if let Some(list) = std::env::var_os("KUBECONFIG") {
        if let Some(p) = std::env::split_paths(&list).find(|p| p.is_file()) {
            return Some(p);
        }
    }
    let home = std::env::var_os("HOME")?;
    let p = Path::new(&home).join(".kube").join("config");
    p.is_file().then_some(p)
}

fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[cfg(test)]
mod tests;
