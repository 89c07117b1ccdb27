// Command release versions the repository's modules together.
//
// The library (github.com/go-idem/idem) and the sub-modules published beside
// it (idemgrpc, idemotel) are tagged at one commit with one version. A
// sub-module's go.mod must require a version of the library that its users
// can download, never a replace of "..", which they would not see; so it
// requires the library's latest release, and a release moves that
// requirement to the version being released. The modules that are not
// published (examples, cmd/idembench) follow the same rule, so that one
// proxy resolves them all.
//
// Development barely sees this: go.work builds every module with the work
// tree, and its replace of the library at the required versions spares it
// fetching their go.mod. Only tidy, which ignores the workspace, needs the
// release itself. It is not on a public proxy until its tags are pushed, and
// tags do not survive every clone, so `proxy` makes a module proxy in a
// directory from the commits listed in the file releases.
//
// Usage:
//
//	go run ./internal/release proxy DIR
//
// serves every release of the library listed in internal/release/releases
// from DIR, for GOPROXY=file://DIR (scripts/test runs it before tidy).
//
//	go run ./internal/release release [-dry-run] vX.Y.Z
//
// (what scripts/release runs) makes two commits: go.work replaces the
// library at vX.Y.Z too; then the release commit, in which every module that
// requires the library requires vX.Y.Z, tidied against a proxy that serves
// the first commit's library as vX.Y.Z, and releases lists vX.Y.Z with that
// commit. It prints the tags to create on the release commit. With -dry-run
// it prints the changes instead and changes nothing.
package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/mod/semver"
	"golang.org/x/mod/zip"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "proxy":
		if len(os.Args) != 3 {
			usage()
		}
		err = runProxy(os.Args[2])
	case "release":
		fl := flag.NewFlagSet("release", flag.ExitOnError)
		dryRun := fl.Bool("dry-run", false, "print what the release would change and change nothing")
		_ = fl.Parse(os.Args[2:])
		if fl.NArg() != 1 {
			usage()
		}
		err = runRelease(os.Stdout, fl.Arg(0), *dryRun)
	case "pin":
		fl := flag.NewFlagSet("pin", flag.ExitOnError)
		dryRun := fl.Bool("dry-run", false, "print what pinning would change and change nothing")
		_ = fl.Parse(os.Args[2:])
		if fl.NArg() != 0 {
			usage()
		}
		err = runPin(os.Stdout, *dryRun)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "release:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: go run ./internal/release proxy DIR\n       go run ./internal/release release [-dry-run] vX.Y.Z\n       go run ./internal/release pin [-dry-run]")
	os.Exit(2)
}

func runProxy(dir string) error {
	repo, err := repoRoot(".")
	if err != nil {
		return err
	}
	rs, err := readReleases(repo)
	if err != nil {
		return err
	}
	if err := addReleases(proxyDir(dir), repo, rs); err != nil {
		return err
	}
	return addPinned(proxyDir(dir), repo, rs)
}

func runRelease(w io.Writer, version string, dryRun bool) error {
	repo, err := repoRoot(".")
	if err != nil {
		return err
	}
	if !isRelease(version) {
		return fmt.Errorf("%q is not a release version (vX.Y.Z, major v0 or v1)", version)
	}
	rs, err := readReleases(repo)
	if err != nil {
		return err
	}
	last := latest(rs)
	if semver.Compare(version, last) <= 0 {
		return fmt.Errorf("%s is not after the latest release, %s", version, last)
	}
	// The release is the library's files as committed; changes not
	// committed would be in no tag.
	status, err := git(repo, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return err
	}
	if len(status) > 0 {
		if !dryRun {
			return fmt.Errorf("the work tree has changes; commit or stash them first:\n%s", status)
		}
		fmt.Fprintf(w, "NOTE: the work tree has changes, which a release would refuse; this dry run uses HEAD:\n%s\n", status)
	}
	mods, err := requirers(repo)
	if err != nil {
		return err
	}
	for _, dir := range published {
		if !slices.Contains(mods, dir) {
			return fmt.Errorf("published module %s is not in go.work or does not require %s", dir, rootPath)
		}
	}
	head, err := revParse(repo, "HEAD")
	if err != nil {
		return err
	}
	files, err := commitFiles(repo, head)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "idem-release-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	// First commit: the workspace takes version from the work tree too. It
	// comes before the release commit because go.work is one of the
	// library's files: the release commit changes none of them, so the
	// commit recorded in releases zips to the same module as the tag.
	work, err := os.ReadFile(filepath.Join(repo, "go.work"))
	if err != nil {
		return err
	}
	newWork, err := workForRelease(work, last, version)
	if err != nil {
		return err
	}
	base := head
	switch {
	case bytes.Equal(work, newWork):
		// Done by an earlier run that stopped before the release commit.
	case dryRun:
		fmt.Fprintf(w, "would commit: Prepare release %s\n", version)
		if err := diff(w, tmp, "go.work", work, newWork); err != nil {
			return err
		}
		files = replaced(files, "go.work", newWork)
		base = "THE_PREPARE_COMMIT"
	default:
		if err := os.WriteFile(filepath.Join(repo, "go.work"), newWork, 0o644); err != nil {
			return err
		}
		msg := fmt.Sprintf("Prepare release %s: go.work builds %s %s from the work tree", version, rootPath, version)
		if base, err = commit(w, repo, msg, "go.work"); err != nil {
			return err
		}
		if files, err = commitFiles(repo, base); err != nil {
			return err
		}
	}

	// The release commit: every module requires version, tidied against a
	// proxy that serves the library's files as version.
	z, err := moduleZip(rootPath, version, files)
	if err != nil {
		return err
	}
	p := proxyDir(filepath.Join(tmp, "proxy"))
	if err := p.add(rootPath, version, z, time.Now()); err != nil {
		return err
	}
	env, err := goEnv(p, filepath.Join(tmp, "modcache"))
	if err != nil {
		return err
	}
	if dryRun {
		fmt.Fprintf(w, "would commit: Release %s\n", version)
	}
	changed, err := requireVersion(w, repo, files, mods, version, tmp, env, dryRun)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("%s %s\n", version, base)
	tagged := "THE_RELEASE_COMMIT"
	if dryRun {
		fmt.Fprintf(w, "and append to %s: %s", releasesFile, line)
	} else {
		f, err := os.OpenFile(filepath.Join(repo, releasesFile), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		_, err = f.WriteString(line)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		msg := fmt.Sprintf("Release %s: the modules require %s %s", version, rootPath, version)
		if tagged, err = commit(w, repo, msg, append(changed, releasesFile)...); err != nil {
			return err
		}
	}

	tags := []string{version}
	for _, dir := range published {
		tags = append(tags, dir+"/"+version)
	}
	fmt.Fprintln(w, "tags to create, all on the release commit, then push:")
	for _, t := range tags {
		fmt.Fprintf(w, "  git tag %s %s\n", t, tagged)
	}
	fmt.Fprintf(w, "  git push origin %s\n", strings.Join(tags, " "))
	return nil
}

// requireVersion makes each module of mods require the library at version,
// tidied against env's proxy (see prepare), and writes their go.mod and
// go.sum into the repository, which it returns; with dryRun it prints the
// diffs instead and writes nothing.
func requireVersion(w io.Writer, repo string, files []zip.File, mods []string, version, tmp string, env []string, dryRun bool) ([]string, error) {
	var changed []string
	for _, dir := range mods {
		out, err := prepare(files, dir, version, filepath.Join(tmp, "modules"), env)
		if err != nil {
			return nil, err
		}
		for _, name := range []string{"go.mod", "go.sum"} {
			rel := filepath.Join(dir, name)
			data, err := os.ReadFile(filepath.Join(out, name))
			if err != nil {
				return nil, err
			}
			if dryRun {
				old, err := os.ReadFile(filepath.Join(repo, rel))
				if err != nil {
					return nil, err
				}
				if err := diff(w, tmp, rel, old, data); err != nil {
					return nil, err
				}
				continue
			}
			if err := os.WriteFile(filepath.Join(repo, rel), data, 0o644); err != nil {
				return nil, err
			}
			changed = append(changed, rel)
		}
	}
	return changed, nil
}

func revParse(repo, rev string) (string, error) {
	out, err := git(repo, "rev-parse", "--verify", rev+"^{commit}")
	return strings.TrimSpace(string(out)), err
}

// commit commits paths with message msg and returns the commit.
func commit(w io.Writer, repo, msg string, paths ...string) (string, error) {
	if _, err := git(repo, append([]string{"add", "--"}, paths...)...); err != nil {
		return "", err
	}
	if _, err := git(repo, "commit", "-m", msg); err != nil {
		return "", err
	}
	c, err := revParse(repo, "HEAD")
	if err != nil {
		return "", err
	}
	fmt.Fprintf(w, "committed %s: %s\n", c, msg)
	return c, nil
}

// diff prints the unified diff of the file rel of the repository, from
// old to new; tmp is a scratch directory.
func diff(w io.Writer, tmp, rel string, old, new []byte) error {
	dir, err := os.MkdirTemp(tmp, "diff-")
	if err != nil {
		return err
	}
	for side, data := range map[string][]byte{"a": old, "b": new} {
		name := filepath.Join(dir, side, rel)
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(name, data, 0o644); err != nil {
			return err
		}
	}
	cmd := exec.Command("git", "diff", "--no-index", "--no-color", "--no-prefix",
		filepath.Join("a", rel), filepath.Join("b", rel))
	cmd.Dir = dir
	out, err := cmd.Output()
	if ee, ok := err.(*exec.ExitError); ok && ee.ExitCode() == 1 {
		err = nil // the files differ
	}
	if err != nil {
		return fmt.Errorf("git diff %s: %w", rel, err)
	}
	_, err = w.Write(out)
	return err
}
