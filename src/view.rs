//! What a cache keeps of a kind when it keeps less than the kind's own type: a view type with
//! the object's `metadata`, stored in kube's reflector stores under the kind it views
//! ([`view_of!`](crate::view_of)), and filled from the kind's watch ([`map_event`]).

use kube::runtime::watcher::Event;

/// `event` with its object, if any, turned into the view `f` makes of it.
pub fn map_event<K, V>(event: Event<K>, f: impl Fn(K) -> V) -> Event<V> {
    match event {
        Event::Apply(o) => Event::Apply(f(o)),
        Event::Delete(o) => Event::Delete(f(o)),
        Event::Init => Event::Init,
        Event::InitApply(o) => Event::InitApply(f(o)),
        Event::InitDone => Event::InitDone,
    }
}

/// Makes `$view` (a struct with a `metadata: ObjectMeta` field) a namespaced
/// [`kube::Resource`] of the kind of `$kind`, so that a reflector store keeps it under that
/// kind's name.
#[macro_export]
macro_rules! view_of {
    ($view:ty, $kind:ty) => {
        impl kube::Resource for $view {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::kind(dt)
            }

            fn group(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::group(dt)
            }

            fn version(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::version(dt)
            }

            fn plural(dt: &()) -> std::borrow::Cow<'_, str> {
                <$kind as kube::Resource>::plural(dt)
            }

            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
