/// The shared informer of `example.com/v1` `Widget`, from a `SharedInformerFactory`.
#[derive(::core::clone::Clone)]
pub struct WidgetInformer {
    informer: my::kinformer::cache::SharedIndexInformer<Widget>,
}
impl WidgetInformer {
    /// The factory's shared informer for this type, created on first use.
    #[inline]
    pub fn new(
        factory: &my::kinformer::factory::SharedInformerFactory,
    ) -> ::core::result::Result<Self, my::kinformer::factory::FactoryError> {
        ::core::result::Result::Ok(Self {
            informer: factory.informer_for::<Widget>()?,
        })
    }
    /// The underlying shared informer.
    #[inline]
    pub fn informer(&self) -> &my::kinformer::cache::SharedIndexInformer<Widget> {
        &self.informer
    }
    /// A lister over the informer's cache.
    #[inline]
    pub fn lister(&self) -> WidgetLister {
        WidgetLister {
            lister: my::kinformer::cache::Lister::new(self.informer.indexer().clone()),
        }
    }
    /// Adds an event handler to the shared informer.
    #[inline]
    pub fn add_event_handler(
        &self,
        handler: impl my::kinformer::cache::ResourceEventHandler<Widget>,
    ) -> ::core::result::Result<
        my::kinformer::cache::ResourceEventHandlerRegistration<Widget>,
        my::kinformer::cache::InformerError,
    > {
        self.informer.add_event_handler(handler)
    }
    /// Whether the informer's cache has synced.
    #[inline]
    pub fn has_synced(&self) -> bool {
        self.informer.has_synced()
    }
}
/// Lists and gets `Widget` objects from the informer's cache.
#[derive(::core::clone::Clone)]
pub struct WidgetLister {
    lister: my::kinformer::cache::Lister<Widget>,
}
impl WidgetLister {
    /// Every cached object matching `selector`.
    #[inline]
    pub fn list(
        &self,
        selector: &my::kinformer::cache::Selector,
    ) -> ::std::vec::Vec<::std::sync::Arc<Widget>> {
        self.lister.list(selector)
    }
    /// The keys of the objects the server holds that do not decode into this type, with
    /// why (they are never taken for deleted; see `lookup`).
    #[inline]
    pub fn undecodable(
        &self,
    ) -> ::std::vec::Vec<(::std::string::String, my::kinformer::cache::Undecodable)> {
        self.lister.undecodable()
    }
}
impl WidgetLister {
    /// The object named `name`, if cached.
    #[inline]
    pub fn get(&self, name: &str) -> ::core::option::Option<::std::sync::Arc<Widget>> {
        self.lister.get(name)
    }
    /// The object named `name`: cached, present on the server but undecodable (never
    /// taken for deleted), or absent.
    #[inline]
    pub fn lookup(&self, name: &str) -> my::kinformer::cache::Lookup<Widget> {
        self.lister.lookup(name)
    }
}
impl Widget {
    /// The shared `Widget` informer of `factory` (the same one `informer_for` returns).
    #[inline]
    pub fn informer(
        factory: &my::kinformer::factory::SharedInformerFactory,
    ) -> ::core::result::Result<WidgetInformer, my::kinformer::factory::FactoryError> {
        WidgetInformer::new(factory)
    }
    /// The shared metadata-only `Widget` informer of `factory`: its cache holds each object's `ObjectMeta` alone (the same one `metadata_informer_for` returns).
    #[inline]
    pub fn metadata_informer(
        factory: &my::kinformer::factory::SharedInformerFactory,
    ) -> ::core::result::Result<
        my::kinformer::cache::SharedIndexInformer<
            my::kinformer::factory::PartialObjectMeta<Widget>,
        >,
        my::kinformer::factory::FactoryError,
    > {
        factory.metadata_informer_for::<Widget>()
    }
}
