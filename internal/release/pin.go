package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/mod/module"
	"golang.org/x/mod/semver"
)

// Between releases the modules may require a development commit of the
// library instead of its latest release, as a pseudo-version
// (vX.Y.(Z+1)-0.yyyymmddhhmmss-abcdefabcdef): when they use a package the
// latest release does not have yet, tidy cannot resolve it from the release.
// `pin` makes that requirement for HEAD; `proxy` serves every pseudo-version
// the modules require from its commit, as it serves releases from theirs;
// and a release moves the modules back onto a release. A pseudo-version of
// a pushed commit is one users can download too (the public proxy fetches
// any commit), but published modules are only tagged at releases, whose
// commit requires that release.

// pinned are the pseudo-versions of the library that the workspace's
// modules require, each with the commit it names.
func pinned(repo string, rs []release) ([]release, error) {
	mods, err := requirers(repo)
	if err != nil {
		return nil, err
	}
	last := latest(rs)
	var out []release
	for _, dir := range mods {
		mf, err := readModFile(filepath.Join(repo, filepath.FromSlash(dir), "go.mod"))
		if err != nil {
			return nil, err
		}
		for _, r := range mf.Require {
			v := r.Mod.Version
			if r.Mod.Path != rootPath || !module.IsPseudoVersion(v) ||
				slices.ContainsFunc(out, func(p release) bool { return p.Version == v }) {
				continue
			}
			if semver.Compare(v, last) <= 0 {
				return nil, fmt.Errorf("%s/go.mod requires %s %s, a commit before the latest release (%s)", dir, rootPath, v, last)
			}
			rev, err := module.PseudoVersionRev(v)
			if err != nil {
				return nil, err
			}
			commit, err := revParse(repo, rev)
			if err != nil {
				return nil, fmt.Errorf("%s/go.mod requires %s %s, whose commit %s is not in this clone (git fetch --unshallow): %w", dir, rootPath, v, rev, err)
			}
			out = append(out, release{Version: v, Commit: commit})
		}
	}
	return out, nil
}

// pseudoVersion is the pseudo-version of commit, after release last.
func pseudoVersion(repo, last, commit string) (string, error) {
	at, err := commitTime(repo, commit)
	if err != nil {
		return "", err
	}
	return module.PseudoVersion(semver.Major(last), last, at.UTC(), commit[:12]), nil
}

// runPin makes the workspace's modules require HEAD's library as a
// pseudo-version, tidied against a proxy that serves HEAD's files as that
// version, and go.work replace that version with the work tree; it commits
// the change. HEAD's library is what the commit names, so commit the
// library first.
func runPin(w io.Writer, dryRun bool) error {
	repo, err := repoRoot(".")
	if err != nil {
		return err
	}
	rs, err := readReleases(repo)
	if err != nil {
		return err
	}
	status, err := git(repo, "status", "--porcelain", "--untracked-files=no")
	if err != nil {
		return err
	}
	if len(status) > 0 && !dryRun {
		return fmt.Errorf("the work tree has changes; commit the library first, then pin it:\n%s", status)
	}
	head, err := revParse(repo, "HEAD")
	if err != nil {
		return err
	}
	last := latest(rs)
	version, err := pseudoVersion(repo, last, head)
	if err != nil {
		return err
	}
	files, err := commitFiles(repo, head)
	if err != nil {
		return err
	}
	mods, err := requirers(repo)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "idem-pin-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)

	work, err := os.ReadFile(filepath.Join(repo, "go.work"))
	if err != nil {
		return err
	}
	newWork, err := workForRelease(work, last, version)
	if err != nil {
		return err
	}
	z, err := moduleZip(rootPath, version, files)
	if err != nil {
		return err
	}
	at, err := commitTime(repo, head)
	if err != nil {
		return err
	}
	p := proxyDir(filepath.Join(tmp, "proxy"))
	if err := p.add(rootPath, version, z, at); err != nil {
		return err
	}
	env, err := goEnv(p, filepath.Join(tmp, "modcache"))
	if err != nil {
		return err
	}
	if dryRun {
		if err := diff(w, tmp, "go.work", work, newWork); err != nil {
			return err
		}
	} else if err := os.WriteFile(filepath.Join(repo, "go.work"), newWork, 0o644); err != nil {
		return err
	}
	changed, err := requireVersion(w, repo, files, mods, version, tmp, env, dryRun)
	if err != nil {
		return err
	}
	changed = append(changed, "go.work")
	if dryRun {
		fmt.Fprintf(w, "would commit: the modules require %s %s\n", rootPath, version)
		return nil
	}
	_, err = commit(w, repo, fmt.Sprintf("Pin the modules to %s %s (%s), which has packages %s does not", rootPath, version, head[:12], last), changed...)
	return err
}

// addPinned serves the library at every pseudo-version the modules
// require, each made from its commit, as addReleases serves releases.
func addPinned(p proxyDir, repo string, rs []release) error {
	pins, err := pinned(repo, rs)
	if err != nil {
		return err
	}
	return addReleases(p, repo, pins)
}
