package pgtest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ory/dockertest/v3"
	"github.com/ory/dockertest/v3/docker"
)

const (
	dockerRepository = "postgres"
	dockerTag        = "15"

	// dockerExpiry bounds the life of every container, so one whose test binary died before Close
	// does not run forever; a test run needing a docker server for longer loses it. It is a
	// `timeout` wrapped around the image's entrypoint rather than dockertest's Resource.Expire:
	// Expire stops the container at once with a grace period, and postgres's smart shutdown,
	// which that SIGTERM starts, refuses new connections for the rest of the run.
	dockerExpiry = time.Hour
)

func startDocker(ctx context.Context, cfg *config) (*Server, error) {
	pool, err := dockertest.NewPool(cfg.dockerEndpoint)
	if err != nil {
		return nil, unavailable(KindDocker, "no Docker client: %v", err)
	}
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = pool.Client.PingWithContext(pingCtx)
	cancel()
	if err != nil {
		return nil, unavailable(KindDocker, "no Docker engine answers (%v)", err)
	}

	began := time.Now()
	cmd := []string{"postgres"}
	for _, setting := range cfg.settings {
		cmd = append(cmd, "-c", setting)
	}
	resource, err := pool.RunWithOptions(&dockertest.RunOptions{
		Repository: dockerRepository,
		Tag:        dockerTag,
		Env:        []string{"POSTGRES_PASSWORD=postgres"},
		// SIGQUIT, sent by timeout to the whole process group, is postgres's immediate shutdown.
		Entrypoint: []string{"timeout", "-s", "QUIT", strconv.Itoa(int(dockerExpiry.Seconds())), "docker-entrypoint.sh"},
		Cmd:        cmd,
		Labels:     map[string]string{"idem-pgtest": newMarker().String()},
	}, func(hc *docker.HostConfig) {
		hc.AutoRemove = true
		hc.RestartPolicy = docker.RestartPolicy{Name: "no"}
	})
	if err != nil {
		return nil, fmt.Errorf("pgtest: run %s:%s container: %w", dockerRepository, dockerTag, err)
	}
	purge := func() error {
		if err := pool.Purge(resource); err != nil {
			return fmt.Errorf("pgtest: remove container %s: %w", resource.Container.ID, err)
		}
		return nil
	}

	adminURL := fmt.Sprintf("postgres://postgres:postgres@%s/postgres?sslmode=disable", resource.GetHostPort("5432/tcp"))
	if err := waitReady(ctx, adminURL, containerExited(pool, resource.Container.ID)); err != nil {
		return nil, errors.Join(fmt.Errorf("pgtest: %s:%s container did not become ready: %w", dockerRepository, dockerTag, err), purge())
	}
	server, err := newServer(KindDocker, adminURL, cfg.logf)
	if err != nil {
		return nil, errors.Join(err, purge())
	}
	server.stop = purge
	cfg.logf("pgtest: docker %s:%s ready at %s in %s", dockerRepository, dockerTag,
		resource.GetHostPort("5432/tcp"), time.Since(began).Round(time.Millisecond))
	return server, nil
}

// containerExited returns a channel that is closed if the container stops, so waitReady gives up on
// a container that crashed instead of waiting out its deadline. The watcher ends with the container;
// if the engine cannot tell, the channel stays open and the deadline decides.
func containerExited(pool *dockertest.Pool, id string) <-chan struct{} {
	exited := make(chan struct{})
	go func() {
		if _, err := pool.Client.WaitContainer(id); err == nil {
			close(exited)
		}
	}()
	return exited
}
