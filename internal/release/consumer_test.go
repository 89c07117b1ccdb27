package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

// A module outside the repository that imports the library and the
// published sub-modules builds from a module proxy alone, without a replace,
// at the version the next release would have: the library and the
// sub-modules are zipped from the work tree, the sub-modules' go.mod
// rewritten and tidied as scripts/release does.
func TestConsumerBuildsWithoutReplace(t *testing.T) {
	began := time.Now()
	repo := repo(t)
	rs, err := readReleases(repo)
	if err != nil {
		t.Fatal(err)
	}
	version := nextPatch(latest(rs))
	tmp := t.TempDir()
	p := proxyDir(filepath.Join(tmp, "proxy"))
	files, err := workTreeFiles(repo)
	if err != nil {
		t.Fatal(err)
	}
	z, err := moduleZip(rootPath, version, files)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.add(rootPath, version, z, began); err != nil {
		t.Fatal(err)
	}
	env, err := goEnv(p, filepath.Join(tmp, "modcache"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{rootPath: true}
	for _, dir := range published {
		out, err := prepare(files, dir, version, filepath.Join(tmp, "modules"), env)
		if err != nil {
			t.Fatal(err)
		}
		modPath, err := modulePath(files, dir)
		if err != nil {
			t.Fatal(err)
		}
		var buf bytes.Buffer
		if err := zip.CreateFromDir(&buf, module.Version{Path: modPath, Version: version}, out); err != nil {
			t.Fatal(err)
		}
		if err := p.add(modPath, version, buf.Bytes(), began); err != nil {
			t.Fatal(err)
		}
		want[modPath] = true
	}

	consumer := filepath.Join(tmp, "consumer")
	if rel, err := filepath.Rel(repo, consumer); err == nil && !strings.HasPrefix(rel, "..") {
		t.Fatalf("the consumer (%s) must be outside the repository (%s)", consumer, repo)
	}
	if err := os.MkdirAll(consumer, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(consumer, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/consumer\n\ngo 1.26.0\n")
	write("consumer.go", `// Package consumer uses idem as a service does: a store, a runner observed
// through OpenTelemetry, a gRPC interceptor.
package consumer

import (
	"github.com/go-idem/idem"
	"github.com/go-idem/idem/idemgrpc"
	"github.com/go-idem/idem/idemotel"
	"github.com/go-idem/idem/pgstore"
)

var (
	_ = pgstore.New
	_ = idem.NewRunner
	_ = idemotel.New
	_ = idemgrpc.UnaryServerInterceptor
)
`)
	// What a user's shell has: no workspace, the module proxy. -mod=mod
	// lets go build add what go get left out, as a user's go would ask to.
	// -trimpath keeps the build cache's keys free of the module cache's
	// directory, new on every run: with it, a run after the first
	// compiles nothing it compiled before (gRPC and OpenTelemetry
	// included) and takes seconds.
	env = append(env, "GOFLAGS=-mod=mod -modcacherw -trimpath")
	goCmd := func(args ...string) {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = consumer
		cmd.Env = env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %s in a module outside the repository: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	var get []string
	for m := range want {
		get = append(get, m+"@"+version)
	}
	slices.Sort(get)
	goCmd(append([]string{"get"}, get...)...)
	goCmd("build", "./...")

	mf, err := readModFile(filepath.Join(consumer, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	if len(mf.Replace) > 0 {
		t.Errorf("the consumer's go.mod has a replace: %v", mf.Replace[0].Old)
	}
	for _, r := range mf.Require {
		if want[r.Mod.Path] {
			if r.Mod.Version != version {
				t.Errorf("the consumer requires %s %s, want %s", r.Mod.Path, r.Mod.Version, version)
			}
			delete(want, r.Mod.Path)
		}
	}
	for m := range want {
		t.Errorf("the consumer's go.mod does not require %s", m)
	}
	t.Logf("a module outside the repository, with no replace, got %s from a file proxy (the work tree as release %s would publish it) and built, in %s",
		strings.Join(get, " "), version, time.Since(began).Round(100*time.Millisecond))
}

// nextPatch is v with its patch number one higher.
func nextPatch(v string) string {
	var major, minor, patch int
	if _, err := fmt.Sscanf(v, "v%d.%d.%d", &major, &minor, &patch); err != nil {
		panic(fmt.Sprintf("nextPatch(%q): %v", v, err))
	}
	return fmt.Sprintf("v%d.%d.%d", major, minor, patch+1)
}
