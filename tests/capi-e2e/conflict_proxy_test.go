package e2e

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	kerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"sigs.k8s.io/cluster-api/test/framework"
	utilyaml "sigs.k8s.io/cluster-api/util/yaml"
)

// conflictRetryingProxy is the management cluster's proxy for a spec that updates objects a
// controller writes at the same moment. The framework's CreateOrUpdate reads each object and
// writes it back once with the resourceVersion it read; any write in between, a status write
// included, fails that Update with 409 Conflict and the spec with it. The KCP adoption spec
// updates its Cluster right after the control-plane Machine's Node is Ready, which is when
// CAPI's cluster controller writes that Cluster's status (the Machine's readiness reaching the
// Cluster's conditions, about a second after it reaches the Machine): the audit log of a run
// shows those status patches, upstream's own CI has the same failure
// (kubernetes-sigs/cluster-api#12314).
//
// Only the objects whose write got a Conflict are written again, each read anew for its
// current resourceVersion (client-go's RetryOnConflict with conflictBackoff); every other
// error, and a conflict that outlasts the retries, fails as before.
type conflictRetryingProxy struct {
	framework.ClusterProxy
}

// conflictBackoff is how the proxy writes a conflicted object again: up to 30 times over 20 to
// 40 s, each wait drawn anew (jitter 1: between one and two times the step). A controller
// writes an object in bursts (a status write or a few), and the retries outlast one; client-go's
// DefaultRetry (5 tries within about 0.1 s) did not on a loaded machine. Against a writer that
// never pauses no retry helps: the read and the write of every try are apart by more than its
// writes are, and the test's writer therefore stops.
var conflictBackoff = wait.Backoff{Steps: 30, Duration: 10 * time.Millisecond, Factor: 1.5, Jitter: 1, Cap: time.Second}

// conflictsRetried counts the objects the proxy wrote again after a Conflict.
var conflictsRetried atomic.Int64

func (p conflictRetryingProxy) CreateOrUpdate(ctx context.Context, resources []byte, opts ...framework.CreateOrUpdateOption) error {
	err := p.ClusterProxy.CreateOrUpdate(ctx, resources, opts...)
	if err == nil {
		return nil
	}
	errs := []error{err}
	var agg kerrors.Aggregate
	if errors.As(err, &agg) {
		errs = agg.Errors()
	}
	objs, parseErr := utilyaml.ToUnstructured(resources)
	if parseErr != nil {
		return err
	}
	c := p.GetClient()
	var left []error
	for _, e := range errs {
		obj := conflicted(c, objs, e)
		if obj == nil {
			left = append(left, e)
			continue
		}
		fmt.Fprintf(GinkgoWriter, "%s %s: written meanwhile by another client (409 Conflict); reading it again and retrying\n",
			obj.GetKind(), client.ObjectKeyFromObject(obj))
		conflictsRetried.Add(1)
		if rerr := retry.RetryOnConflict(conflictBackoff, func() error {
			existing := &unstructured.Unstructured{}
			existing.SetGroupVersionKind(obj.GroupVersionKind())
			if err := c.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
				return err
			}
			o := obj.DeepCopy()
			o.SetResourceVersion(existing.GetResourceVersion())
			return c.Update(ctx, o, client.FieldValidation("Strict"))
		}); rerr != nil {
			left = append(left, rerr)
		}
	}
	return kerrors.NewAggregate(left)
}

// conflicted returns the object of objs that err, a 409 Conflict, is about, or nil when err is
// no Conflict or names none of them. A Conflict names the object's group, resource and name.
func conflicted(c client.Client, objs []unstructured.Unstructured, err error) *unstructured.Unstructured {
	var status apierrors.APIStatus
	if !apierrors.IsConflict(err) || !errors.As(err, &status) || status.Status().Details == nil {
		return nil
	}
	d := status.Status().Details
	for i := range objs {
		o := &objs[i]
		gvk := o.GroupVersionKind()
		if o.GetName() != d.Name || gvk.Group != d.Group {
			continue
		}
		mapping, err := c.RESTMapper().RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil && mapping.Resource.Resource == d.Kind {
			return o
		}
	}
	return nil
}

// The proxy against an object another client writes in a burst, as a controller's status
// writes come: every CreateOrUpdate through it succeeds, having met a Conflict, while the
// framework's own fails on the same object.
var _ = Describe("When an object is updated while another client writes it", Label("kairon-conflict-retry"), func() {
	It("the conflict-retrying proxy's CreateOrUpdate succeeds where the framework's gets 409 Conflict", func() {
		c := bootstrapClusterProxy.GetClient()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "conflict-retry-"}}
		Expect(c.Create(ctx, ns)).To(Succeed())
		DeferCleanup(func() { _ = c.Delete(context.Background(), ns) })
		cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "busy", Namespace: ns.Name}}
		Expect(c.Create(ctx, cm)).To(Succeed())

		// The other client: an annotation patched as fast as the API server takes it, until
		// stopped or until `done` says so.
		var writes atomic.Int64
		writer := func(done func() bool) (stop func()) {
			stopped := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; !done(); i++ {
					select {
					case <-stopped:
						return
					default:
					}
					patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"writer":"%d"}}}`, i))
					if c.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch)) == nil {
						writes.Add(1)
					}
				}
			}()
			return func() { close(stopped); wg.Wait() }
		}
		underway := func(from int64) {
			Eventually(func() int64 { return writes.Load() - from }, 30*time.Second, 10*time.Millisecond).
				Should(BeNumerically(">=", 3), "the other client's writes")
		}
		manifest := func(i int) []byte {
			return []byte(fmt.Sprintf("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: busy\n  namespace: %s\ndata:\n  round: \"%d\"\n", ns.Name, i))
		}
		never := func() bool { return false }

		By("the framework's CreateOrUpdate against the object written without pause")
		stop := writer(never)
		underway(0)
		rawConflict := false
		for i := 0; i < 200 && !rawConflict; i++ {
			err := bootstrapClusterProxy.CreateOrUpdate(ctx, manifest(i))
			if err != nil {
				Expect(err.Error()).To(ContainSubstring("the object has been modified"), "only a Conflict is expected")
				rawConflict = true
			}
		}
		stop()
		Expect(rawConflict).To(BeTrue(), "the framework's CreateOrUpdate never met the other client's writes: this test shows nothing")

		// A controller writes in bursts; this writer's burst lasts until the proxy has met a
		// Conflict, so whether it meets one does not depend on the machine's pace (a fixed 2 s
		// burst went by without one on a loaded machine), and then pauses, as a controller's
		// burst ends, for the proxy's retries to find the object still.
		By("the conflict-retrying proxy's CreateOrUpdate against the same object written until it meets a Conflict")
		retriedBefore := conflictsRetried.Load()
		met := func() bool { return conflictsRetried.Load() > retriedBefore }
		stop = writer(met)
		defer stop()
		underway(writes.Load())
		proxy := conflictRetryingProxy{bootstrapClusterProxy}
		last := 0
		for i := 1000; i < 1200 && !met(); i++ {
			Expect(proxy.CreateOrUpdate(ctx, manifest(i))).To(Succeed())
			last = i
		}
		Expect(met()).To(BeTrue(), "the proxy met no Conflict in 200 writes against a client writing without pause: this test shows nothing")
		got := &corev1.ConfigMap{}
		Expect(c.Get(ctx, client.ObjectKeyFromObject(cm), got)).To(Succeed())
		Expect(got.Data).To(HaveKeyWithValue("round", fmt.Sprint(last)))
	})
})
