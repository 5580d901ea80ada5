/// The shared informer of `example.com/v1` `Foo`, from a `SharedInformerFactory`.
#[derive(::core::clone::Clone)]
pub struct FooInformer {
    informer: ::kinformer::cache::SharedIndexInformer<Foo>,
}
impl FooInformer {
    /// The factory's shared informer for this type, created on first use.
    #[inline]
    pub fn new(
        factory: &::kinformer::factory::SharedInformerFactory,
    ) -> ::core::result::Result<Self, ::kinformer::factory::FactoryError> {
        ::core::result::Result::Ok(Self {
            informer: factory.informer_for::<Foo>()?,
        })
    }
    /// The underlying shared informer.
    #[inline]
    pub fn informer(&self) -> &::kinformer::cache::SharedIndexInformer<Foo> {
        &self.informer
    }
    /// A lister over the informer's cache.
    #[inline]
    pub fn lister(&self) -> FooLister {
        FooLister {
            lister: ::kinformer::cache::Lister::new(self.informer.indexer().clone()),
        }
    }
    /// Adds an event handler to the shared informer.
    #[inline]
    pub fn add_event_handler(
        &self,
        handler: impl ::kinformer::cache::ResourceEventHandler<Foo>,
    ) -> ::core::result::Result<
        ::kinformer::cache::ResourceEventHandlerRegistration<Foo>,
        ::kinformer::cache::InformerError,
    > {
        self.informer.add_event_handler(handler)
    }
    /// Whether the informer's cache has synced.
    #[inline]
    pub fn has_synced(&self) -> bool {
        self.informer.has_synced()
    }
}
/// Lists and gets `Foo` objects from the informer's cache.
#[derive(::core::clone::Clone)]
pub struct FooLister {
    lister: ::kinformer::cache::Lister<Foo>,
}
impl FooLister {
    /// Every cached object matching `selector`.
    #[inline]
    pub fn list(
        &self,
        selector: &::kinformer::cache::Selector,
    ) -> ::std::vec::Vec<::std::sync::Arc<Foo>> {
        self.lister.list(selector)
    }
    /// The keys of the objects the server holds that do not decode into this type, with
    /// why (they are never taken for deleted; see `lookup`).
    #[inline]
    pub fn undecodable(
        &self,
    ) -> ::std::vec::Vec<(::std::string::String, ::kinformer::cache::Undecodable)> {
        self.lister.undecodable()
    }
}
impl FooLister {
    /// The `Foo` objects of `namespace`, served from the namespace index.
    #[inline]
    pub fn foos(&self, namespace: &str) -> FooNamespaceLister {
        FooNamespaceLister {
            lister: self.lister.namespaced(namespace),
        }
    }
}
/// Lists and gets the `Foo` objects of one namespace from the informer's cache.
pub struct FooNamespaceLister {
    lister: ::kinformer::cache::NamespaceLister<Foo>,
}
impl FooNamespaceLister {
    /// Objects of this namespace matching `selector`.
    #[inline]
    pub fn list(
        &self,
        selector: &::kinformer::cache::Selector,
    ) -> ::std::vec::Vec<::std::sync::Arc<Foo>> {
        self.lister.list(selector)
    }
    /// The object of this namespace named `name`, if cached.
    #[inline]
    pub fn get(&self, name: &str) -> ::core::option::Option<::std::sync::Arc<Foo>> {
        self.lister.get(name)
    }
    /// The object of this namespace named `name`: cached, present on the server but
    /// undecodable (never taken for deleted), or absent.
    #[inline]
    pub fn lookup(&self, name: &str) -> ::kinformer::cache::Lookup<Foo> {
        self.lister.lookup(name)
    }
}
impl Foo {
    /// The shared `Foo` informer of `factory` (the same one `informer_for` returns).
    #[inline]
    pub fn informer(
        factory: &::kinformer::factory::SharedInformerFactory,
    ) -> ::core::result::Result<FooInformer, ::kinformer::factory::FactoryError> {
        FooInformer::new(factory)
    }
    /// The shared metadata-only `Foo` informer of `factory`: its cache holds each object's `ObjectMeta` alone (the same one `metadata_informer_for` returns).
    #[inline]
    pub fn metadata_informer(
        factory: &::kinformer::factory::SharedInformerFactory,
    ) -> ::core::result::Result<
        ::kinformer::cache::SharedIndexInformer<
            ::kinformer::factory::PartialObjectMeta<Foo>,
        >,
        ::kinformer::factory::FactoryError,
    > {
        factory.metadata_informer_for::<Foo>()
    }
}
