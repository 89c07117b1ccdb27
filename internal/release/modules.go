package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

// rootPath is the library's module, the one every other module of the
// repository requires.
const rootPath = "github.com/go-idem/idem"

// published are the sub-modules a release tags beside the library, by
// directory: their users fetch them from the module proxy, so their go.mod
// must name a version of the library that exists there.
var published = []string{"idemgrpc", "idemotel"}

// releasesFile lists the library's releases and, for each, a commit whose
// library files are that release's. Tags do not survive every clone, and
// tidy must resolve the version the modules require from the clone alone,
// so the commit is written down.
const releasesFile = "internal/release/releases"

type release struct {
	Version string
	Commit  string
}

func readReleases(repo string) ([]release, error) {
	f, err := os.Open(filepath.Join(repo, releasesFile))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []release
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) != 2 || !isRelease(fields[0]) || len(fields[1]) != 40 {
			return nil, fmt.Errorf("%s:%d: want \"vX.Y.Z <40-hex commit>\", got %q", releasesFile, n, line)
		}
		out = append(out, release{Version: fields[0], Commit: fields[1]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s lists no release", releasesFile)
	}
	return out, nil
}

// isRelease reports whether v is a version a release may have: canonical
// semver, no prerelease, no major version past v1 (which would need a /vN
// module path).
func isRelease(v string) bool {
	return semver.IsValid(v) && semver.Canonical(v) == v && semver.Prerelease(v) == "" &&
		(semver.Major(v) == "v0" || semver.Major(v) == "v1")
}

// latest is the highest version of rs.
func latest(rs []release) string {
	v := rs[0].Version
	for _, r := range rs[1:] {
		if semver.Compare(r.Version, v) > 0 {
			v = r.Version
		}
	}
	return v
}

func git(repo string, args ...string) ([]byte, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("git %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(stderr.Bytes()))
	}
	return out, nil
}

// repoRoot is the top of the git work tree dir is in.
func repoRoot(dir string) (string, error) {
	out, err := git(dir, "rev-parse", "--show-toplevel")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
}

// commitFiles are the repository's files at commit, as the go command
// sees them when it makes a module zip from a tag: git archive's output
// (which honours export-ignore), with line endings as committed.
func commitFiles(repo, commit string) ([]zip.File, error) {
	if _, err := git(repo, "rev-parse", "--verify", "--quiet", commit+"^{commit}"); err != nil {
		return nil, fmt.Errorf("commit %s is not in this clone (a shallow clone? `git fetch --unshallow`): %w", commit, err)
	}
	data, err := git(repo, "-c", "core.autocrlf=input", "-c", "core.eol=lf", "archive", "--format=zip", commit)
	if err != nil {
		return nil, err
	}
	zr, err := zipReader(data)
	if err != nil {
		return nil, err
	}
	var files []zip.File
	for _, f := range zr.File {
		if !strings.HasSuffix(f.Name, "/") {
			files = append(files, archived{f})
		}
	}
	return files, nil
}

// workTreeFiles are the files a commit of the work tree as it is would
// hold: tracked ones still present and untracked ones git does not ignore.
// Build outputs and other ignored files stay out, as they would of a
// release.
func workTreeFiles(repo string) ([]zip.File, error) {
	out, err := git(repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return nil, err
	}
	var files []zip.File
	seen := map[string]bool{}
	for _, name := range strings.Split(string(out), "\x00") {
		if name == "" || seen[name] {
			continue
		}
		seen[name] = true
		p := filepath.Join(repo, filepath.FromSlash(name))
		info, err := os.Lstat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted, not yet committed
		}
		if err != nil {
			return nil, err
		}
		files = append(files, onDisk{name: name, path: p, info: info})
	}
	return files, nil
}

// under re-roots the files inside dir ("" for the whole repository) at
// dir. Files of modules nested deeper stay in: zip.Create leaves them out,
// by the same rule as the go command.
func under(files []zip.File, dir string) []zip.File {
	if dir == "" {
		return files
	}
	prefix := strings.TrimSuffix(dir, "/") + "/"
	var out []zip.File
	for _, f := range files {
		if rest, ok := strings.CutPrefix(f.Path(), prefix); ok {
			out = append(out, rerooted{f, rest})
		}
	}
	return out
}

// moduleZip is the module zip of files as version of modPath.
func moduleZip(modPath, version string, files []zip.File) ([]byte, error) {
	var buf bytes.Buffer
	if err := zip.Create(&buf, module.Version{Path: modPath, Version: version}, files); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// proxyDir is a module proxy in a directory, which the go command reads
// through GOPROXY=file://DIR (the layout of `go help goproxy`).
type proxyDir string

// add serves the module zip z as version of modPath.
func (p proxyDir) add(modPath, version string, z []byte, at time.Time) error {
	escPath, err := module.EscapePath(modPath)
	if err != nil {
		return err
	}
	escVersion, err := module.EscapeVersion(version)
	if err != nil {
		return err
	}
	dir := filepath.Join(string(p), filepath.FromSlash(escPath), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	gomod, err := zipGoMod(modPath, version, z)
	if err != nil {
		return err
	}
	info, err := json.Marshal(struct {
		Version string
		Time    string
	}{version, at.UTC().Format(time.RFC3339)})
	if err != nil {
		return err
	}
	for ext, data := range map[string][]byte{".zip": z, ".mod": gomod, ".info": info} {
		if err := os.WriteFile(filepath.Join(dir, escVersion+ext), data, 0o644); err != nil {
			return err
		}
	}
	list := filepath.Join(dir, "list")
	old, err := os.ReadFile(list)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	versions := strings.Fields(string(old))
	if !slices.Contains(versions, version) {
		versions = append(versions, version)
	}
	semver.Sort(versions)
	return os.WriteFile(list, []byte(strings.Join(versions, "\n")+"\n"), 0o644)
}

// url is p for GOPROXY.
func (p proxyDir) url() string {
	abs, err := filepath.Abs(string(p))
	if err != nil {
		abs = string(p)
	}
	return "file://" + filepath.ToSlash(abs)
}

// zipGoMod is the go.mod in module zip z; the go command synthesises one
// for a module without.
func zipGoMod(modPath, version string, z []byte) ([]byte, error) {
	zr, err := zipReader(z)
	if err != nil {
		return nil, err
	}
	for _, f := range zr.File {
		if f.Name == modPath+"@"+version+"/go.mod" {
			rc, err := f.Open()
			if err != nil {
				return nil, err
			}
			defer rc.Close()
			return io.ReadAll(rc)
		}
	}
	return []byte("module " + modfile.AutoQuote(modPath) + "\n"), nil
}

// addReleases serves the library at every version in rs, each made from
// its commit.
func addReleases(p proxyDir, repo string, rs []release) error {
	for _, r := range rs {
		files, err := commitFiles(repo, r.Commit)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Version, err)
		}
		z, err := moduleZip(rootPath, r.Version, files)
		if err != nil {
			return fmt.Errorf("%s: %w", r.Version, err)
		}
		at, err := commitTime(repo, r.Commit)
		if err != nil {
			return err
		}
		if err := p.add(rootPath, r.Version, z, at); err != nil {
			return err
		}
	}
	return nil
}

func commitTime(repo, commit string) (time.Time, error) {
	out, err := git(repo, "log", "-1", "--format=%cI", commit)
	if err != nil {
		return time.Time{}, err
	}
	return time.Parse(time.RFC3339, strings.TrimSpace(string(out)))
}

// goEnv is the environment for go commands that resolve the library from
// p before the usual proxies, outside any workspace. GONOSUMDB keeps the
// checksum database from being asked about versions that are not public
// (yet); go.sum still pins their hashes.
//
// With modcache set, the commands use it as their module cache, so that a
// version made up for a check or a release that is not yet final never
// lands in the real module cache, where it would outlive its content; the
// real cache's downloads come next in GOPROXY, so nothing already
// downloaded is fetched again.
func goEnv(p proxyDir, modcache string) ([]string, error) {
	out, err := exec.Command("go", "env", "GOPROXY", "GONOSUMDB", "GOFLAGS", "GOMODCACHE").Output()
	if err != nil {
		return nil, fmt.Errorf("go env: %w", err)
	}
	lines := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(lines) != 4 {
		return nil, fmt.Errorf("go env GOPROXY GONOSUMDB GOFLAGS GOMODCACHE: unexpected output %q", out)
	}
	goproxy, nosumdb, goflags, realCache := lines[0], lines[1], lines[2], lines[3]
	proxies := []string{p.url()}
	env := append(os.Environ(), "GOWORK=off")
	if modcache != "" {
		if realCache != "" {
			proxies = append(proxies, proxyDir(filepath.Join(realCache, "cache", "download")).url())
		}
		// -modcacherw: the module cache is removed with its temporary
		// directory, which read-only directories would prevent.
		env = append(env, "GOMODCACHE="+modcache, "GOFLAGS="+strings.TrimSpace(goflags+" -modcacherw"))
	}
	if goproxy != "" && goproxy != "off" {
		proxies = append(proxies, goproxy)
	}
	if nosumdb != "" {
		nosumdb += ","
	}
	return append(env,
		"GOPROXY="+strings.Join(proxies, ","),
		"GONOSUMDB="+nosumdb+rootPath,
	), nil
}

// prepare writes the published form of the sub-module in dir into a new
// directory under tmp: its files with go.mod requiring the library at
// version, and go.mod and go.sum tidied against env's proxy. It refuses a
// go.mod that replaces the library, which its users would never see.
func prepare(files []zip.File, dir, version, tmp string, env []string) (string, error) {
	modPath, err := modulePath(files, dir)
	if err != nil {
		return "", err
	}
	// Through a zip, so that the copy is exactly what the module zip holds.
	z, err := moduleZip(modPath, version, under(files, dir))
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return "", err
	}
	zipFile := filepath.Join(tmp, strings.ReplaceAll(dir, "/", "_")+".zip")
	if err := os.WriteFile(zipFile, z, 0o644); err != nil {
		return "", err
	}
	out := filepath.Join(tmp, filepath.FromSlash(dir))
	if err := zip.Unzip(out, module.Version{Path: modPath, Version: version}, zipFile); err != nil {
		return "", err
	}
	gomodPath := filepath.Join(out, "go.mod")
	data, err := os.ReadFile(gomodPath)
	if err != nil {
		return "", err
	}
	mf, err := modfile.Parse(dir+"/go.mod", data, nil)
	if err != nil {
		return "", err
	}
	for _, r := range mf.Replace {
		if r.Old.Path == rootPath {
			return "", fmt.Errorf("%s/go.mod replaces %s: its users would not see the replace; require a release instead", dir, rootPath)
		}
	}
	if err := mf.AddRequire(rootPath, version); err != nil {
		return "", err
	}
	mf.Cleanup()
	data, err = mf.Format()
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(gomodPath, data, 0o644); err != nil {
		return "", err
	}
	cmd := exec.Command("go", "mod", "tidy")
	cmd.Dir = out
	cmd.Env = env
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go mod tidy in %s (requiring %s %s): %w\n%s", dir, rootPath, version, err, msg)
	}
	return out, nil
}

// modulePath is the module path in dir's go.mod among files.
func modulePath(files []zip.File, dir string) (string, error) {
	for _, f := range under(files, dir) {
		if f.Path() != "go.mod" {
			continue
		}
		rc, err := f.Open()
		if err != nil {
			return "", err
		}
		data, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			return "", err
		}
		if p := modfile.ModulePath(data); p != "" {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: no go.mod with a module line", dir)
}

// requirers are the workspace's modules (go.work's directories, relative to
// the repository) that require the library.
func requirers(repo string) ([]string, error) {
	data, err := os.ReadFile(filepath.Join(repo, "go.work"))
	if err != nil {
		return nil, err
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, u := range wf.Use {
		dir := path.Clean(filepath.ToSlash(u.Path))
		if dir == "." {
			continue
		}
		mf, err := readModFile(filepath.Join(repo, filepath.FromSlash(dir), "go.mod"))
		if err != nil {
			return nil, err
		}
		for _, r := range mf.Require {
			if r.Mod.Path == rootPath {
				out = append(out, dir)
				break
			}
		}
	}
	return out, nil
}

func readModFile(name string) (*modfile.File, error) {
	data, err := os.ReadFile(name)
	if err != nil {
		return nil, err
	}
	return modfile.Parse(name, data, nil)
}

// workForRelease is go.work (data) with the library replaced by the
// work tree at last (the latest release, which the modules require until
// the release commit) and at version (which they require after it, a
// release's or a pin's), and at no other version.
func workForRelease(data []byte, last, version string) ([]byte, error) {
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		return nil, err
	}
	var drop []string
	for _, r := range wf.Replace {
		if r.Old.Path == rootPath && r.Old.Version != last && r.Old.Version != version {
			drop = append(drop, r.Old.Version)
		}
	}
	for _, v := range drop {
		if err := wf.DropReplace(rootPath, v); err != nil {
			return nil, err
		}
	}
	for _, v := range []string{last, version} {
		if err := wf.AddReplace(rootPath, v, "./", ""); err != nil {
			return nil, err
		}
	}
	wf.Cleanup()
	return modfile.Format(wf.Syntax), nil
}
