package main

import (
	"bytes"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
	"golang.org/x/mod/sumdb/dirhash"
)

func repo(t *testing.T) string {
	t.Helper()
	dir, err := repoRoot(".")
	if err != nil {
		t.Fatalf("the release tests need the git checkout: %v", err)
	}
	return dir
}

// Every module that requires the library requires its latest release, or a
// commit after it pinned as a pseudo-version (see pin.go), with no replace: a
// replace in a published module's go.mod is invisible to its users, who
// would then need a version that does not exist.
func TestModulesRequireTheLatestRelease(t *testing.T) {
	repo := repo(t)
	rs, err := readReleases(repo)
	if err != nil {
		t.Fatal(err)
	}
	want := latest(rs)
	pins, err := pinned(repo, rs)
	if err != nil {
		t.Fatal(err)
	}
	mods, err := requirers(repo)
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range published {
		if !slices.Contains(mods, dir) {
			t.Errorf("%s is published but is not in go.work or does not require %s", dir, rootPath)
		}
	}
	// go.work replaces that release with the work tree: without it, every
	// command in the workspace needs the release's go.mod from a proxy, and
	// a fresh clone cannot build.
	data, err := os.ReadFile(filepath.Join(repo, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	wf, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range append([]string{want}, versions(pins)...) {
		replaced := false
		for _, r := range wf.Replace {
			if r.Old.Path == rootPath && r.Old.Version == v && path.Clean(r.New.Path) == "." && r.New.Version == "" {
				replaced = true
			}
		}
		if !replaced {
			t.Errorf("go.work does not replace %s %s with ./ (the work tree)", rootPath, v)
		}
	}
	for _, dir := range mods {
		mf, err := readModFile(filepath.Join(repo, dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range mf.Replace {
			if r.Old.Path == rootPath || slices.Contains(published, dir) {
				t.Errorf("%s/go.mod: replace %s => %s: a published module must not replace anything, and no module replaces the library (go.work stands in for it during development)",
					dir, r.Old.Path, r.New.Path)
			}
		}
		for _, r := range mf.Require {
			if r.Mod.Path != rootPath {
				continue
			}
			v := r.Mod.Version
			switch {
			case slices.Contains(versions(pins), v):
				// A commit after the latest release, in this clone (pinned
				// checked both).
			case module.IsPseudoVersion(v) || semver.Compare(v, "v0.0.0") <= 0:
				t.Errorf("%s/go.mod requires %s %s, a version that was never released; want %s", dir, rootPath, v, want)
			case v != want:
				t.Errorf("%s/go.mod requires %s %s; want the latest release, %s (scripts/release moves every module to the version it releases)", dir, rootPath, v, want)
			}
		}
	}
}

// The local proxy's zip of each release is the one its go.sum lines pin,
// and the same on every build: tidy in scripts/test depends on both.
func TestReleaseZipsMatchGoSum(t *testing.T) {
	repo := repo(t)
	rs, err := readReleases(repo)
	if err != nil {
		t.Fatal(err)
	}
	mods, err := requirers(repo)
	if err != nil {
		t.Fatal(err)
	}
	pins, err := pinned(repo, rs)
	if err != nil {
		t.Fatal(err)
	}
	compared := 0
	for _, r := range append(rs, pins...) {
		var hashes []string
		for range 2 {
			files, err := commitFiles(repo, r.Commit)
			if err != nil {
				t.Fatalf("%s: %v", r.Version, err)
			}
			z, err := moduleZip(rootPath, r.Version, files)
			if err != nil {
				t.Fatalf("%s: %v", r.Version, err)
			}
			name := filepath.Join(t.TempDir(), "m.zip")
			if err := os.WriteFile(name, z, 0o644); err != nil {
				t.Fatal(err)
			}
			h, err := dirhash.HashZip(name, dirhash.Hash1)
			if err != nil {
				t.Fatal(err)
			}
			hashes = append(hashes, h)
		}
		if hashes[0] != hashes[1] {
			t.Fatalf("%s: two zips of commit %s hash differently: %s, %s", r.Version, r.Commit, hashes[0], hashes[1])
		}
		line := fmt.Sprintf("%s %s %s\n", rootPath, r.Version, hashes[0])
		for _, dir := range mods {
			sum, err := os.ReadFile(filepath.Join(repo, dir, "go.sum"))
			if err != nil {
				t.Fatal(err)
			}
			prefix := fmt.Sprintf("%s %s h1:", rootPath, r.Version)
			if bytes.Contains(sum, []byte(prefix)) && !bytes.Contains(sum, []byte(line)) {
				t.Errorf("%s/go.sum pins %s %s to another hash than the zip of commit %s (%s)", dir, rootPath, r.Version, r.Commit, hashes[0])
			}
			if bytes.Contains(sum, []byte(line)) {
				compared++
			}
		}
	}
	if compared == 0 {
		t.Errorf("no go.sum pins a release or a pinned commit of %s: nothing was compared", rootPath)
	}
}

// versions are rs's versions.
func versions(rs []release) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Version
	}
	return out
}
