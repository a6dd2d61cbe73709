package kubenode

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-run/airlock"
	corev1 "k8s.io/api/core/v1"
)

// ReasonErrImageNeverPull is the waiting reason of a container whose
// image is not in the node's store under imagePullPolicy Never, as a
// kubelet's.
const ReasonErrImageNeverPull = "ErrImageNeverPull"

// neverPullRetry is how often a container waiting in ErrImageNeverPull
// looks for its image in the store again (a local look-up: someone may
// load the image on the node).
const neverPullRetry = 10 * time.Second

// neverPullError: the image is not in the store and the pull policy is
// Never.
type neverPullError struct{ image string }

func (e *neverPullError) Error() string {
	return fmt.Sprintf("Container image %q is not present with pull policy of Never", e.image)
}

// pullPolicy is the container's imagePullPolicy, or the API server's
// default when it is empty (a pod not made through the API): Always for
// an image without a tag or digest or with tag latest, else IfNotPresent.
func pullPolicy(c *corev1.Container) corev1.PullPolicy {
	if c.ImagePullPolicy != "" {
		return c.ImagePullPolicy
	}
	ref := c.Image
	if strings.Contains(ref, "@") {
		return corev1.PullIfNotPresent
	}
	name := ref[strings.LastIndexByte(ref, '/')+1:]
	if _, tag, ok := strings.Cut(name, ":"); !ok || tag == "latest" {
		return corev1.PullAlways
	}
	return corev1.PullIfNotPresent
}

// digestRef is the reference of exactly this image: its repository (the
// stored name without tag or digest) @ its manifest digest, which the
// container status shows as imageID, as a kubelet's does.
func digestRef(info airlock.ImageInfo) string {
	return repository(info.Ref) + "@" + info.Digest
}

// repository is ref without its tag or digest.
func repository(ref string) string {
	if at := strings.IndexByte(ref, '@'); at >= 0 {
		ref = ref[:at]
	}
	slash := strings.LastIndexByte(ref, '/')
	if colon := strings.LastIndexByte(ref, ':'); colon > slash {
		ref = ref[:colon]
	}
	return ref
}

// resolveImage finds the container's image as its imagePullPolicy says,
// as a kubelet does when it starts a container: Always pulls it from its
// registry (a name that moved there gets the new image; a registry that
// cannot be reached is a pull error, even with the image in the store),
// IfNotPresent uses the store's and pulls only when it is absent, Never
// uses the store's or fails with *neverPullError. It records the
// kubelet's events (Pulling, Pulled). Pull errors wrap
// airlock.ErrImageNotFound.
func (p *Provider) resolveImage(ctx context.Context, pod *corev1.Pod) (airlock.ImageInfo, error) {
	c := &pod.Spec.Containers[0]
	policy := pullPolicy(c)
	if policy != corev1.PullAlways {
		info, err := p.rt.LocalImage(c.Image)
		if err == nil {
			p.event(pod, corev1.EventTypeNormal, "Pulled", fmt.Sprintf("Container image %q already present on machine", c.Image))
			return info, nil
		}
		if !errors.Is(err, airlock.ErrImageNotFound) {
			return airlock.ImageInfo{}, err
		}
		if policy == corev1.PullNever {
			return airlock.ImageInfo{}, &neverPullError{image: c.Image}
		}
	}
	p.event(pod, corev1.EventTypeNormal, "Pulling", fmt.Sprintf("Pulling image %q", c.Image))
	t0 := time.Now()
	info, err := p.rt.PullImage(ctx, c.Image, airlock.PullEvents{})
	if err != nil {
		return airlock.ImageInfo{}, err
	}
	p.event(pod, corev1.EventTypeNormal, "Pulled", fmt.Sprintf("Successfully pulled image %q in %s. Image size: %d bytes.",
		c.Image, time.Since(t0).Round(time.Millisecond), info.Size))
	return info, nil
}
