// Command pgdocker runs a throwaway PostgreSQL container for package pgtest, which starts it with
// `go run` when it falls back to Docker (see pgtest's docker.go).
//
// It is a module of its own so that the Docker client it needs is not a requirement of
// github.com/go-idem/idem: every requirement of the library's go.mod, even one that only its tests
// use, is in the module graph of every service that imports idem. Nothing imports this command, so
// nothing inherits its requirements.
//
// It reports on stdout, one line each:
//
//	unavailable <reason>  no Docker engine answers (exit status 0; pgtest reports the source as unavailable)
//	started <host:port>   the container runs; postgres:postgres can connect once the server is ready
//	exited                the container stopped on its own
//
// It removes the container when its stdin reaches end of file, which happens when pgtest closes the
// server and also when the test process dies, however it dies; interrupts are left to the test
// process for that reason. A container left behind all the same stops after -expiry. Any other
// failure exits with status 1 and a message on stderr.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "pgdocker:", err)
		os.Exit(1)
	}
}

func run() error {
	endpoint := flag.String("endpoint", "", "Docker engine; default DOCKER_HOST, else the platform's default socket")
	image := flag.String("image", "postgres:15", "image as repository:tag")
	expiry := flag.Duration("expiry", time.Hour, "the container stops this long after it started, whatever happens")
	label := flag.String("label", "", "value of the container's idem-pgtest label")
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: pgdocker [flags] [name=value ...]\n\nname=value arguments are postgres server settings.")
		flag.PrintDefaults()
	}
	flag.Parse()
	repository, tag, ok := strings.Cut(*image, ":")
	if !ok {
		return fmt.Errorf("-image %q is not repository:tag", *image)
	}

	// The test process decides when the container goes, through stdin; an interrupt reaches the
	// whole process group, and dying of it here would leave the container running.
	signal.Ignore(os.Interrupt, syscall.SIGTERM)

	pool, err := dockertest.NewPool(*endpoint)
	if err != nil {
		fmt.Printf("unavailable no Docker client: %v\n", oneLine(err))
		return nil
	}
	pingCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err = pool.Client.PingWithContext(pingCtx)
	cancel()
	if err != nil {
		fmt.Printf("unavailable no Docker engine answers (%v)\n", oneLine(err))
		return nil
	}

	cmd := []string{"postgres"}
	for _, setting := range flag.Args() {
		cmd = append(cmd, "-c", setting)
	}
	resource, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: repository,
		Tag:        tag,
		Env:        []string{"POSTGRES_PASSWORD=postgres"},
		// The expiry is a `timeout` wrapped around the image's entrypoint rather than dockertest's
		// Resource.Expire: Expire stops the container at once with a grace period, and postgres's
		// smart shutdown, which that SIGTERM starts, refuses new connections for the rest of the
		// run. SIGQUIT, sent by timeout to the whole process group, is postgres's immediate shutdown.
		Entrypoint: []string{"timeout", "-s", "QUIT", strconv.Itoa(int(expiry.Seconds())), "docker-entrypoint.sh"},
		Cmd:        cmd,
		Labels:     map[string]string{"idem-pgtest": *label},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return fmt.Errorf("run %s container: %w", *image, err)
	}
	fmt.Printf("started %s\n", resource.GetHostPort("5432/tcp"))

	exited := make(chan struct{})
	go func() {
		if _, err := pool.Client.WaitContainer(resource.Container.ID); err == nil {
			close(exited)
		}
	}()
	released := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(released)
	}()
	select {
	case <-exited:
		fmt.Println("exited") // and AutoRemove removes it
		return nil
	case <-released:
	}
	if err := pool.Purge(resource); err != nil {
		return fmt.Errorf("remove container %s: %w", resource.Container.ID, err)
	}
	return nil
}

// oneLine keeps the protocol one line per message.
func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}
