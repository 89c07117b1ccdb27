package pgtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

const (
	dockerRepository = "postgres"
	dockerTag        = "15"

	// dockerExpiry bounds the life of every container, so one whose test binary died before Close
	// does not run forever; a test run needing a docker server for longer loses it.
	dockerExpiry = time.Hour

	// dockerHelperDir is the helper command that starts and removes the container, relative to
	// this package's source directory.
	dockerHelperDir = "pgdocker"

	// dockerStopTimeout bounds how long Close waits for the helper to remove the container.
	dockerStopTimeout = time.Minute
)

// startDocker runs a postgres container through pgdocker, a command in a module of its own beside
// this package, which it builds and runs with `go run`. The Docker client lives there, not here, so
// that it is no requirement of the library's module and so of no service that imports idem (see
// pgdocker's doc for the protocol). This costs a build of the Docker client the first time, which
// the build cache then keeps, and it needs the go command and idem's source tree, both of which a
// test run or `go run ./examples/rides demo` has.
func startDocker(ctx context.Context, cfg *config) (*Server, error) {
	dir, err := dockerHelperSource()
	if err != nil {
		return nil, unavailable(KindDocker, "%v", err)
	}
	goCmd, err := exec.LookPath("go")
	if err != nil {
		return nil, unavailable(KindDocker, "no go command to run the Docker helper with (%v)", err)
	}
	args := []string{"run", ".",
		"-image", dockerRepository + ":" + dockerTag,
		"-expiry", dockerExpiry.String(),
		"-label", newMarker().String(),
	}
	if cfg.dockerEndpoint != "" {
		args = append(args, "-endpoint", cfg.dockerEndpoint)
	}
	args = append(args, "--")
	args = append(args, cfg.settings...)

	began := time.Now()
	helper, err := startDockerHelper(dir, goCmd, args)
	if err != nil {
		return nil, err
	}
	var first string
	select {
	case line, ok := <-helper.first:
		if !ok {
			return nil, fmt.Errorf("pgtest: Docker helper (go run in %s): %w", dir, helper.stop())
		}
		first = line
	case <-ctx.Done():
		return nil, errors.Join(fmt.Errorf("pgtest: Docker helper: %w", ctx.Err()), helper.stop())
	}

	kind, rest, _ := strings.Cut(first, " ")
	switch kind {
	case "unavailable":
		if err := helper.stop(); err != nil {
			return nil, fmt.Errorf("pgtest: Docker helper: %w", err)
		}
		return nil, unavailable(KindDocker, "%s", rest)
	case "started":
	default:
		return nil, errors.Join(fmt.Errorf("pgtest: Docker helper said %q", first), helper.stop())
	}

	adminURL := fmt.Sprintf("postgres://postgres:postgres@%s/postgres?sslmode=disable", rest)
	if err := waitReady(ctx, adminURL, helper.exited); err != nil {
		return nil, errors.Join(fmt.Errorf("pgtest: %s:%s container did not become ready: %w", dockerRepository, dockerTag, err), helper.stop())
	}
	server, err := newServer(KindDocker, adminURL, cfg.logf)
	if err != nil {
		return nil, errors.Join(err, helper.stop())
	}
	server.stop = helper.stop
	cfg.logf("pgtest: docker %s:%s ready at %s in %s", dockerRepository, dockerTag, rest, time.Since(began).Round(time.Millisecond))
	return server, nil
}

// dockerHelperSource finds pgdocker's source, beside this file's.
func dockerHelperSource() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok || !filepath.IsAbs(file) {
		return "", fmt.Errorf("the Docker helper's source cannot be located (a binary built with -trimpath?); run from a checkout of idem")
	}
	dir := filepath.Join(filepath.Dir(file), dockerHelperDir)
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return "", fmt.Errorf("the Docker helper's source is not at %s; run from a checkout of idem", dir)
	}
	return dir, nil
}

// dockerHelper is a running pgdocker. The container lives until stop closes its stdin.
type dockerHelper struct {
	cmd    *exec.Cmd
	stdin  io.Closer
	stderr *bytes.Buffer // read only after done

	first  chan string   // the first line, then closed; closed without a line if there is none
	exited chan struct{} // closed when the container or the helper is gone
	done   chan struct{} // closed when the helper has exited; err is set then
	err    error
}

func startDockerHelper(dir, goCmd string, args []string) (*dockerHelper, error) {
	cmd := exec.Command(goCmd, args...)
	cmd.Dir = dir
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("pgtest: Docker helper: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("pgtest: Docker helper: %w", err)
	}
	h := &dockerHelper{
		cmd: cmd, stdin: stdin, stderr: &bytes.Buffer{},
		first: make(chan string, 1), exited: make(chan struct{}), done: make(chan struct{}),
	}
	cmd.Stderr = h.stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("pgtest: start the Docker helper: %w", err)
	}
	go h.read(stdout)
	return h, nil
}

// read follows the helper's stdout to its end, then waits for the helper to exit.
func (h *dockerHelper) read(stdout io.Reader) {
	scanner := bufio.NewScanner(stdout)
	sawFirst, sawExited := false, false
	for scanner.Scan() {
		line := scanner.Text()
		switch {
		case !sawFirst:
			sawFirst = true
			h.first <- line
			close(h.first)
		case line == "exited" && !sawExited:
			sawExited = true
			close(h.exited)
		}
	}
	_, _ = io.Copy(io.Discard, stdout)
	if !sawFirst {
		close(h.first)
	}
	if !sawExited {
		close(h.exited)
	}
	err := h.cmd.Wait()
	if err != nil {
		err = fmt.Errorf("%w: %s", err, strings.TrimSpace(h.stderr.String()))
	}
	h.err = err
	close(h.done)
}

// stop closes the helper's stdin, which has it remove the container, and waits for it to exit.
// It is safe to call more than once.
func (h *dockerHelper) stop() error {
	_ = h.stdin.Close()
	select {
	case <-h.done:
		return h.err
	case <-time.After(dockerStopTimeout):
		// The helper still has its stdin closed, and removes the container when it gets there.
		_ = h.cmd.Process.Kill()
		return fmt.Errorf("the Docker helper did not remove the container within %s; it stops by itself %s after it started",
			dockerStopTimeout, dockerExpiry)
	}
}
